"""Experiment 10 (beyond the tutorial) - data hunger: from how many molecules on does a Transformer beat a tuned
n-gram?  MOSES training subsets of 1k to 100k molecules, nested.  The tutorial's §11.3 says: under about 1,000
training samples, not a Transformer from scratch; this measures where the crossover lies.

What it does
------------
* Data (``moses_data``): one seeded shuffle of MOSES train; training subset N = its first N molecules (every larger
  subset holds every smaller one); validation = 2,000 further molecules of the shuffle; test = a seeded 10,000-
  molecule sample of MOSES test, the same for every size and model.  Atom-level tokens (``chemdata.tokenize_smiles``);
  one vocabulary per size (every token of its subset), a token the subset never showed is <unk> for both models.
* n-gram (``generation_metrics.fit_ngram``): modified or interpolated Kneser-Ney, n and discount chosen on
  validation at every size, the choice checked interior to the grid (``ngram_choice_interior``); its peak memory
  (tracemalloc, while the chosen model is refitted and scores the test split) recorded per size.
* Transformer: experiment 4's best recipe (``smiles_lm_ladder.recipe("dropout")``: per-token loss, early stopping on
  validation bits/token with patience, dropout with the rate chosen on validation by the mean of seed 0's runs),
  trained by ``smiles_lm_ladder.train_job`` (torch_bridge, float32 here, one thread per job, two jobs at a time), at
  two widths: "tutorial" (d 48, 2 layers, the tutorial's 39,360-parameter shape) and "wide" (d 128, 4 layers,
  d_ff 512: about 20x the parameters).  Every job is its own resumable stage: rerun the same command after Ctrl-C
  and the finished jobs are read back (results identical to an uninterrupted run: each job depends only on its
  inputs and seed).
* Verdict per size and width (``smiles_lm_ladder.beats_ngram``, ``verdict_code``): better only when the paired
  bootstrap of bits/molecule (Transformer - n-gram, over the same test molecules, pooled over the seeds) lies below 0
  AND the gap in bits/token exceeds the seed spread; with one seed the spread half is vacuous, so such a size is
  stored as "lower_one_seed" / "higher_one_seed" (below / above by the paired interval alone), never "better".  The
  crossover: the smallest size that is "better", and the log-N interpolation of where the seed-mean gap changes sign
  (range: the same from the best and worst seed per size).
* Sampling: n free samples at tau 1 from each model at seed 0 (the chosen rate) per size (batched torch sampling for
  the Transformer, ``NgramLM.next_logits`` for the n-gram; a sample without <eos> within MAX_NEW tokens is invalid):
  validity, uniqueness, novelty against that size's training subset, FCD and GuacaMol KL against the test sample
  (each with the n of molecules it used), the share of valid molecules with a ring larger than the subset's largest,
  heavy-atom KS against the test sample.  FCD is biased upward at small n, so beside it ``fcd_matched``: every model
  of a size on the same number of valid molecules (the smallest valid count among them, a seeded subsample).
* Core check (extended): the pure-Python core (``transformer.train``, ~3.6 molecules/s on this host) trains the
  tutorial width at the smallest size once (seed 0, per-token loss, no dropout, core_epochs = 3 epochs: for time),
  and the bridge (float64) the same; their test bits/token agree to 1e-6 or the check fails.

Modes: QUICK (tests: tiny sizes, < 1 min); default (the n-gram at 1k and 10k, the tutorial width at 1k, seed 0,
rate 0.1, 1,000 samples: about 4 minutes); ``--extended`` (the whole study, PLAN_EXTENDED; about 3 hours on 2 cores);
``--rescore`` (each row's verdict and the crossover again from the stored fields of the existing results file;
nothing trained; recorded under "updates").
"""
import math
import os
import time
import tracemalloc

import common

core = common.core
import chemdata  # noqa: E402
import generation_metrics  # noqa: E402
import moses_data  # noqa: E402
import smiles_lm_ladder as ladder  # noqa: E402

LN2 = math.log(2.0)
ORDER_PATIENCE = 3      # the n-gram's order search stops after this many larger orders that are no better
WIDTHS = {"tutorial": dict(d_model=48, n_heads=4, d_ff=96, n_layers=2),
          "wide": dict(d_model=128, n_heads=4, d_ff=512, n_layers=4)}
FULL = dict(pos="sine", tie_weights=True, batch_size=8, lr=3e-3, warmup=100, clip=1.0, epochs=6,
            max_epochs=40, patience=5, n_valid=moses_data.N_VALID, n_test=moses_data.N_TEST, max_new=100,
            ngram_orders=list(range(2, 21)), sample_batch=250, core_epochs=3)
QUICK_OVERRIDES = dict(max_epochs=2, patience=1, n_valid=60, n_test=120, ngram_orders=[2, 3, 4, 5], max_new=60,
                       core_n=24, core_epochs=1)

# Seconds per unit for the job order and the stage estimates (scaled by the host's speed at the start), from the
# extended run at 9b7c0bd (~95 Mflop/s, one thread a job): the n-gram's search and refit, a + b N (its
# wall_time_s: 18 s at 1k to 328 s at 100k); a Transformer epoch per training and per validation molecule (fitted
# to its train_wall_time_s: tutorial 75 s at 1k x 40 epochs to 537 s at 100k x 6, wide 275 s at 1k x 35 to
# 1,808 s at 10k x 40); sampling per sample (its sampling_wall_time_s over 10,000: n-gram 0.0005-0.0027, tutorial
# ~0.005, wide ~0.031); the pure-Python core's molecule-epoch (core_wall_time_s 409 s for 1,000 x 3).
# REFERENCE_S, a model's share of its size's reference sets, scoring and matched FCD, and VERDICT_S, a seed's paired
# bootstrap over 10,000 test molecules, from the --extended run at da19c05 (77 Mflop/s at its last call's start):
# its sampling stage took 1,083 s against 809 s of sampling jobs two at a time, 13 models (6.5 a worker); its
# verdict stage 88 s for 20 seeds' rows; both rescaled to 95 Mflop/s.
RATES_MFLOPS = 95.0
NGRAM_S = (15.0, 0.0031)
EPOCH_S = {"tutorial": (1 / 1130, 1 / 2000), "wide": (1 / 241, 1 / 540)}
SAMPLE_S = {"ngram": 0.002, "tutorial": 0.006, "wide": 0.032}
REFERENCE_S = 34.0
VERDICT_S = 3.6
CORE_S = 0.136

# Which jobs each mode runs: sizes of the n-gram; per width, the sizes and seeds of the Transformer; the dropout
# rates searched (seed 0) at each size; the sample count.  Each job's estimated length: plan_jobs (EPOCH_S).
PLAN_QUICK = dict(sizes=[200, 600], widths={"tutorial": {200: [0, 1], 600: [0]}, "wide": {200: [0]}},
                  rates={200: [0.1, 0.2]}, rate_widths=["tutorial", "wide"], default_rate=None, rates_fallback=0.1,
                  n_samples=40, core_check=True, max_epochs_at={})
PLAN_DEFAULT = dict(sizes=[1000, 10000], widths={"tutorial": {1000: [0]}}, rates={}, rate_widths=[], default_rate=0.1,
                    rates_fallback=0.1, n_samples=1000, core_check=False, max_epochs_at={})
PLAN_EXTENDED = dict(
    sizes=list(moses_data.SIZES),
    widths={"tutorial": {1000: [0, 1, 2], 3000: [0, 1, 2], 10000: [0, 1, 2], 30000: [0], 100000: [0]},
            "wide": {1000: [0, 1, 2], 3000: [0, 1, 2], 10000: [0, 1, 2], 30000: [0], 100000: [0]}},
    rates={1000: [0.05, 0.1, 0.2], 3000: [0.05, 0.1, 0.2], 10000: [0.05, 0.1, 0.2]}, rate_widths=["tutorial"],
    default_rate=None, rates_fallback=0.1, n_samples=10000, core_check=True, max_epochs_at={30000: 10, 100000: 6})
"""--extended, cut for about 3 hours on this 2-core host (BUDGET_S; stage_estimates: ~168 min at 95 Mflop/s; the
run at 6435169 took longer on a slower, partly shared host: page 13's budget line gives its wall time against
both).  The full issue plan with the rate also searched per width estimates ~8 core-hours.  Cuts, all recorded in
results['plan']: the rate is searched (seed 0) for the tutorial width only, at 1k, 3k and 10k; the wide width takes
the tutorial's rate at its size; 30k and 100k take the 10k rate; both widths run one seed at 30k and 100k, epochs
capped at 10 (30k) and 6 (100k), early stopping inside the cap."""


BUDGET_S = 3 * 3600      # the budget for --extended: about 3 hours of wall time on the 2-core machine


def plan_from_results(r):
    """The plan a results file records (results['plan']), its size keys back to ints, as ``stage_estimates``
    takes it."""
    p = r["plan"]
    return dict(p, widths={w: {int(n): s for n, s in by.items()} for w, by in p["widths"].items()},
                **{k: {int(n): v for n, v in (p.get(k) or {}).items()} for k in ("rates", "max_epochs_at")})


def plan_of(run):
    return {"quick": PLAN_QUICK, "extended": PLAN_EXTENDED}.get(run.mode, PLAN_DEFAULT)


# ----------------------------------------------------------------------------- data


def prepare(config, plan, run):
    """Stage 1: the nested subsets, their tokens, one vocabulary per size, and the data record."""
    train, test = moses_data.load_moses("train"), moses_data.load_moses("test")
    sub = moses_data.nested_subsets(train, test, sizes=plan["sizes"], n_valid=config["n_valid"],
                                    n_test=config["n_test"])
    tok = {"valid": [chemdata.tokenize_smiles(s) for s in sub["valid"]],
           "test": [chemdata.tokenize_smiles(s) for s in sub["test"]]}
    sizes = {}
    for n in plan["sizes"]:
        train_tok = [chemdata.tokenize_smiles(s) for s in sub["train"][n]]
        vocab = moses_data.size_vocab(train_tok)
        ids = {"train": [vocab.encode(t) for t in train_tok], "valid": [vocab.encode(t) for t in tok["valid"]],
               "test": [vocab.encode(t) for t in tok["test"]]}
        sizes[n] = {"vocab": vocab, "ids": ids, "smiles": {"train": sub["train"][n]},
                    "record": moses_data.vocab_record(vocab, tok["test"])}
    record = {"n_train_file": len(train), "n_test_file": len(test), "sizes": plan["sizes"],
              "n_valid": len(sub["valid"]), "n_test": len(sub["test"]), "shuffle_seed": moses_data.SHUFFLE_SEED,
              "test_seed": moses_data.TEST_SEED, "order_head": sub["order_head"],
              "test_tokens": sum(len(t) + 1 for t in tok["test"]),
              "vocab": {str(n): sizes[n]["record"] for n in plan["sizes"]},
              "unknown_rule": "one vocabulary per size (every token of its training subset); a validation or test "
                              "token outside it is <unk>, the same id for both models"}
    return sub, sizes, record


# ----------------------------------------------------------------------------- the n-gram


def ngram_at(size, data, config):
    """The tuned n-gram of one size, in two passes on validation (the full grid, 19 orders x ~50 smoothings on
    2,000 molecules, would take ~20 min a size): n upwards through ngram_orders at interpolated Kneser-Ney D 0.75
    until ORDER_PATIENCE larger orders in a row are no better, then every variant and discount of
    generation_metrics' grid at that n.  Interior: n inside the first pass's orders, the
    discount inside the second pass's grid.  Bits/token, per-molecule test bits, peak memory (tracemalloc)."""
    t0 = time.perf_counter()
    ids, vocab = data["ids"], data["vocab"]
    grid_n, first = [], None
    for n in config["ngram_orders"]:                # upwards until ORDER_PATIENCE orders in a row are no better
        m, g = generation_metrics.fit_ngram(ids["train"], ids["valid"], len(vocab), vocab.bos_id, orders=[n],
                                            discounts=(0.75,), variants=("interpolated",))
        grid_n += g
        if first is None or g[0]["valid_bits_per_token"] < min(x["valid_bits_per_token"] for x in grid_n[:-1]):
            first = m
        if n - first.n >= ORDER_PATIENCE:
            break
    model, grid = generation_metrics.fit_ngram(ids["train"], ids["valid"], len(vocab), vocab.bos_id,
                                               orders=[first.n])
    rec = {"variant": model.variant, "n": model.n, "discount": model.discount}
    search_s = time.perf_counter() - t0
    tracemalloc.start()                             # the chosen model refitted and scored, traced (slow under trace)
    model = refit_ngram(rec, data)
    test_bits = [math.fsum(model.bits(x)) for x in ids["test"]]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    n_tok = sum(len(x) - 1 for x in ids["test"])
    interior = {"n_interior": generation_metrics.ngram_choice_interior(grid_n, first)["n_interior"],
                "discount_interior": generation_metrics.ngram_choice_interior(grid, model)["discount_interior"]}
    return {"size": size, "variant": model.variant, "n": model.n, "discount": model.discount, "interior": interior,
            "valid_bits_per_token": min(g["valid_bits_per_token"] for g in grid), "order_pass": grid_n,
            "test_bits_per_token": math.fsum(test_bits) / n_tok, "test_molecule_bits": test_bits,
            "grid_size": len(grid_n) + len(grid), "peak_memory_mb": peak / 2 ** 20, "search_wall_time_s": search_s,
            "wall_time_s": time.perf_counter() - t0,
            "peak_memory_rule": "tracemalloc peak while the chosen n-gram is refitted and scores the test split",
            "process_maxrss_mb": _maxrss_mb(),
            "process_maxrss_rule": "the fitting process's peak resident memory (the search's larger orders and the "
                                   "data it holds included; Linux ru_maxrss)"}


def _maxrss_mb():
    try:
        import resource
    except ImportError:                             # not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def refit_ngram(rec, data):
    """The chosen n-gram again (for sampling): same counts, same smoothing."""
    vocab = data["vocab"]
    base = generation_metrics.NgramLM(len(vocab), rec["n"], None, vocab.bos_id).fit(data["ids"]["train"])
    return base.with_smoothing(rec["variant"], rec["discount"])


# ----------------------------------------------------------------------------- the Transformer


def make_model(config, vocab_size, seed, dropout=0.0):
    extra = {"dropout": dropout} if dropout else {}
    return core.TransformerLM(vocab_size, d_model=config["d_model"], n_heads=config["n_heads"],
                              n_layers=config["n_layers"], d_ff=config["d_ff"], pos=config["pos"],
                              tie_weights=config["tie_weights"], seed=seed, **extra)


def job_tag(width, size, seed, rate):
    return f"tf_{width}_N{size}_seed{seed}_rate{rate}"


def job_context(config, width, data, max_epochs):
    import torch
    cfg = dict(config, **WIDTHS[width])
    return {"config": cfg, "vocab": data["vocab"], "ids": data["ids"], "smiles": data["smiles"],
            "make_model": make_model, "patience": config["patience"], "dtype": torch.float32,
            "max_epochs": max_epochs}


def run_jobs(jobs, config, sizes, run, tag):
    """Each (width, size, seed, rate) trained by smiles_lm_ladder.train_job, two at a time; each one a resumable
    stage (checkpoints/data_hunger/<job>.stage.json), its seed-0 weights saved for sampling."""
    def one(job, rng):
        ctx = job_context(config, job["width"], sizes[job["size"]], job["max_epochs"])
        spec = {"recipe": ladder.recipe("dropout", ctx["config"], job["max_epochs"], job["rate"]),
                "seed": job["seed"], "save_to": weights_path(run, job) if job["seed"] == 0 else None}
        t0 = time.perf_counter()
        rec = run.resumable(job_tag(job["width"], job["size"], job["seed"], job["rate"]),
                            lambda: dict(ladder.train_job(spec, ctx), weights=None, width=job["width"],
                                         size=job["size"], n_params=n_params(ctx, job["rate"])))
        return dict(rec, this_call_s=time.perf_counter() - t0)
    jobs = sorted(jobs, key=lambda j: -j["cost"])              # longest first: two workers balance best
    return core.parallel_map(one, jobs, workers=2, progress=tag)


def weights_path(run, job):
    path = run.checkpoint(job_tag(job["width"], job["size"], job["seed"], job["rate"]))[:-5] + ".pt"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def n_params(ctx, rate):
    return core.param_count(make_model(ctx["config"], len(ctx["vocab"]), 0, rate))


def transformer_stage(config, plan, sizes, run):
    """Phase A: seed 0 at every rate searched (sizes in plan["rates"]); the rate per (width, size) by validation;
    phase B: every other job, at its size's chosen rate (unsearched sizes: the default rate, else the rate chosen
    at the largest searched size below)."""
    searched, rest = plan_jobs(config, plan)
    recs = run_jobs(searched, config, sizes, run, "transformer: rate search") if searched else []
    chosen = choose_rates(recs, plan)
    rest = [dict(j, rate=chosen[j["width"]][str(j["size"])]) for j in rest]
    recs += run_jobs(rest, config, sizes, run, "transformer: seeds") if rest else []
    return recs, chosen


def plan_jobs(config, plan):
    """(the rate search's jobs, every other job with rate None: its size's chosen rate is known only after the
    search), each with its estimated seconds as "cost" (EPOCH_S at its epoch cap)."""
    def job(width, n, seed, rate):
        ep = plan["max_epochs_at"].get(n, config["max_epochs"])
        per_epoch = n * EPOCH_S[width][0] + config["n_valid"] * EPOCH_S[width][1]
        return {"width": width, "size": n, "seed": seed, "rate": rate, "max_epochs": ep, "cost": ep * per_epoch}
    def searched_at(w, n):
        return n in plan["rates"] and w in plan["rate_widths"]
    searched = [job(w, n, 0, r) for w, by in plan["widths"].items() for n in by if searched_at(w, n)
                for r in plan["rates"][n]]
    rest = [job(w, n, s, None) for w, by in plan["widths"].items() for n, seeds in by.items()
            for s in seeds if s or not searched_at(w, n)]
    return searched, rest


def two_at_a_time(seconds):
    """The wall time of jobs of these lengths on two workers, longest first, each taking the next free one."""
    free = [0.0, 0.0]
    for t in sorted(seconds, reverse=True):
        free[free.index(min(free))] += t
    return max(free)


def job_times(results):
    """The recorded job times (seconds) of the timed stages, as ``stage_estimates`` splits them: [n-gram fits,
    rate-search trainings, the other trainings, the core check, each model's sampling].  They are kept in the
    stage checkpoints, so a resumed run has them all (its wall_time_s is its last call's only); the reference
    sets and the scoring keep no time."""
    plan = results["plan"]

    def searched(x):
        return str(x["size"]) in map(str, plan["rates"]) and x["width"] in plan["rate_widths"] and not x["seed"]
    runs = results["transformer_runs"]
    core_s = [results["core_check"]["core_wall_time_s"]] if results.get("core_check") else []
    return [[g["wall_time_s"] for g in results["ngram"].values()],
            [x["train_wall_time_s"] for x in runs if searched(x)],
            [x["train_wall_time_s"] for x in runs if not searched(x)], core_s,
            [s["sampling_wall_time_s"] for s in results["sampling"]]]


def stage_estimates(config, plan, mflops):
    """Estimated seconds of stages 1-6 at this host's speed (``mflops``, the run's start): the measured rates
    above, two jobs at a time where the stage runs two."""
    searched, rest = plan_jobs(config, plan)
    widths = [w for w, by in plan["widths"].items() for _ in by]
    sampled = [SAMPLE_S[m] * plan["n_samples"] + REFERENCE_S * config["n_test"] / moses_data.N_TEST
               for m in ["ngram"] * len(plan["sizes"]) + widths]
    core_s = (CORE_S * config.get("core_n", min(plan["sizes"])) * config["core_epochs"]
              if plan["core_check"] else 0.0)
    out = [5.0, two_at_a_time(NGRAM_S[0] + NGRAM_S[1] * n for n in plan["sizes"]),
           two_at_a_time(j["cost"] for j in searched) + two_at_a_time(j["cost"] for j in rest), core_s,
           two_at_a_time(sampled),
           VERDICT_S * sum(len(seeds) for by in plan["widths"].values() for seeds in by.values())
           * config["n_test"] / moses_data.N_TEST]
    return [t * RATES_MFLOPS / max(mflops, 1.0) for t in out]


def choose_rates(recs, plan):
    """{width: {size: rate}}: the searched sizes' lowest validation bits/token (seed 0); the others inherit."""
    chosen = {}
    for width, by_size in plan["widths"].items():
        chosen[width] = {}
        for n in sorted(by_size):
            mine = [r for r in recs if r["width"] == width and r["size"] == n]
            if mine:
                chosen[width][str(n)] = ladder.choose_rate(mine)[0]
            else:
                below = [int(k) for k in chosen[width] if int(k) in plan["rates"] and width in plan["rate_widths"]]
                chosen[width][str(n)] = (plan["default_rate"] if plan["default_rate"] is not None
                                         else chosen[width][str(max(below))] if below
                                         else chosen["tutorial"].get(str(n)) or plan["rates_fallback"])
    return chosen


# ----------------------------------------------------------------------------- sampling


def sample_transformer(path, ctx, rate, n, seed, config):
    """n free samples at tau 1 from saved weights (float32): ``torch_bridge.sample_lm``, batched ancestral
    sampling, torch.Generator seeded from ``seed``.  -> [(ids after <bos>, ended with <eos>)]."""
    import torch
    import torch_bridge as tb
    torch.set_num_threads(1)
    module = tb.to_torch(make_model(ctx["config"], len(ctx["vocab"]), 0, rate), dtype=torch.float32)
    module.load_state_dict(torch.load(path))
    vocab = ctx["vocab"]
    return tb.sample_lm(module, vocab.bos_id, vocab.eos_id, n, config["max_new"], batch=config["sample_batch"],
                        generator=torch.Generator().manual_seed(seed))


def sample_ngram(model, vocab, n, seed, config):
    """n free samples at tau 1 from the n-gram through ``core.generate`` (it samples anything with
    ``next_logits``), sample i from its own stream ``core.keyed_rng("sample", "n-gram", seed, i)``."""
    out = []
    for i in range(n):
        new, reason = core.generate(model, [vocab.bos_id], config["max_new"], temperature=1.0,
                                    rng=core.keyed_rng("sample", "n-gram", seed, i), eos_id=vocab.eos_id,
                                    return_reason=True)
        out.append((new, reason == "eos"))             # generate leaves <eos> out
    return out


def score_generated(samples, vocab, reference):
    """Validity (no <eos>, or a special id inside: invalid), uniqueness, novelty (generation_metrics.tutorial_novelty),
    FCD and GuacaMol KL against the test sample, the share of valid molecules with a ring larger than the subset's
    largest, heavy-atom KS against the test sample."""
    bad = {vocab.pad_id, vocab.bos_id, vocab.unk_id}
    strings = [("".join(vocab.decode(ids)) if ok and not bad.intersection(ids) else None) for ids, ok in samples]
    rec = generation_metrics.tutorial_novelty(strings, reference["train_canonical"])
    valid = [c for c in rec.pop("canonical") if c]
    shape = generation_metrics.shape_summary(valid, train_max_ring=reference["train_max_ring"])
    heavy = [int(k) for k, m in shape["heavy_atoms_hist"].items() for _ in range(m)]
    rec.update({"no_eos": sum(not ok for _, ok in samples),
                "fcd": generation_metrics.fcd_score(valid, reference["test"]),
                "kl": generation_metrics.guacamol_kl_score(valid, reference["test"]),
                "share_ring_larger_than_train": shape["share_ring_larger_than"],
                "train_max_ring": reference["train_max_ring"], "mean_heavy_atoms": shape["mean_heavy_atoms"],
                "ks_heavy_atoms_vs_test": (generation_metrics.ks_statistic(heavy, reference["test_heavy"])
                                           if heavy else None), "valid_smiles": valid})
    return rec


def reference_of(sub, n):
    """What samples of size n are held against: its training subset's canonical set and largest ring, the test
    sample and its heavy-atom counts."""
    shapes = [x for x in map(generation_metrics.molecule_shape, sub["train"][n]) if x]
    test_shapes = [x for x in map(generation_metrics.molecule_shape, sub["test"]) if x]
    return {"train_canonical": {chemdata.canonical_smiles(s) for s in sub["train"][n]} - {None},
            "train_max_ring": max(x["largest_ring"] for x in shapes), "test": sub["test"],
            "test_heavy": [x["heavy_atoms"] for x in test_shapes]}


def sample_one(name, rate, n, config, plan, reference, sizes, ngrams, run):
    """One model's samples at size n, scored."""
    t0 = time.perf_counter()
    if name == "ngram":
        got = sample_ngram(refit_ngram(ngrams[str(n)], sizes[n]), sizes[n]["vocab"], plan["n_samples"], 0, config)
    else:
        ctx = job_context(config, name, sizes[n], None)
        got = sample_transformer(weights_path(run, {"width": name, "size": n, "seed": 0, "rate": rate}),
                                 ctx, rate, plan["n_samples"], 0, config)
    wall = time.perf_counter() - t0
    return dict(score_generated(got, sizes[n]["vocab"], reference()), model=name, size=n, seed=0,
                rate=rate, n_samples=len(got), sampling_wall_time_s=wall)


def sampling_stage(config, plan, sub, sizes, ngrams, chosen, run):
    """Per size: the n-gram's and each width's seed-0 model's samples, scored; one resumable stage per model, two
    models at a time (each worker builds a size's reference once, when it first samples at that size)."""
    refs = {}

    def one(item, rng):
        name, rate, n = item

        def reference():
            if n not in refs:
                refs[n] = reference_of(sub, n)
            return refs[n]
        row = run.resumable(f"sample_{name}_N{n}",
                            lambda: sample_one(name, rate, n, config, plan, reference, sizes, ngrams, run))
        run.log(f"  sampled {name} at N={n}: validity {row['validity']:.3f}, FCD {row['fcd'].get('fcd')}")
        return row
    items = [(name, rate, n) for n in plan["sizes"] for name, rate in
             [("ngram", None)] + [(w, chosen[w][str(n)]) for w, by in plan["widths"].items() if n in by]]
    return matched_fcd(core.parallel_map(one, items, workers=2, progress="sampling"), sub["test"])


MATCHED_SEED = 0


def matched_fcd(samples, test):
    """FCD is biased upward at small n: per size, every model's FCD again on the same number of valid molecules
    (the smallest valid count among that size's models; a random.Random(MATCHED_SEED) subsample of each) as
    ``fcd_matched``.  The valid SMILES are dropped afterwards (not written to the results file)."""
    import random
    for n in sorted({s["size"] for s in samples}):
        rows = [s for s in samples if s["size"] == n]
        k = min(len(s["valid_smiles"]) for s in rows)
        for s in rows:
            pick = random.Random(MATCHED_SEED).sample(s["valid_smiles"], k)
            s["fcd_matched"] = dict(generation_metrics.fcd_score(pick, test), seed=MATCHED_SEED,
                                    rule="the smallest valid count among this size's models, a seeded subsample")
    for s in samples:
        s.pop("valid_smiles")
    return samples


# ----------------------------------------------------------------------------- verdicts and the crossover


def verdicts(plan, ngrams, recs, chosen):
    """Per size and width: the seeds at the chosen rate and beats_ngram's verdict; per size the width validation
    prefers (lowest mean validation bits/token)."""
    out = []
    for n in plan["sizes"]:
        ng = ngrams.get(str(n))
        for width in plan["widths"]:
            mine = sorted((r for r in recs if r["width"] == width and r["size"] == n and
                           r["dropout"] == chosen[width].get(str(n))), key=lambda r: r["seed"])
            if not mine or ng is None:
                continue
            row = {"size": n, "width": width, "seeds": [r["seed"] for r in mine], "rate": mine[0]["dropout"],
                   "n_params": mine[0]["n_params"], "valid_bits_per_token": [r["valid_bits_per_token"] for r in mine],
                   "epochs_chosen": [r["chosen"]["epoch"] for r in mine],
                   "epochs_run": [r["chosen"]["stopped_at"] for r in mine],
                   "train_wall_time_s": [r["train_wall_time_s"] for r in mine]}
            row.update(ladder.beats_ngram(mine, ng["test_molecule_bits"], ng["test_bits_per_token"]))
            row.update(verdict=verdict_code(row), rule=VERDICT_RULE)
            out.append(row)
    for n in plan["sizes"]:
        rows = [r for r in out if r["size"] == n]
        if rows:
            best = min(rows, key=lambda r: sum(r["valid_bits_per_token"]) / len(r["valid_bits_per_token"]))
            for r in rows:
                r["preferred_by_validation"] = r is best
    return out


VERDICT_RULE = ("better: pooled paired interval (bits/molecule, molecules resampled) below 0 and the gap in bits/token "
                "larger than the seeds' spread (max - min); worse: the mirror; else level.  With one seed the spread "
                "half is vacuous: lower_one_seed / higher_one_seed (below / above by the paired interval alone)")


def verdict_code(row):
    """A row's verdict from its stored fields (paired interval, gap, seed spread, seeds): 'better' / 'worse' /
    'level' as ``smiles_lm_ladder.beats_ngram``, except that one seed is never 'better' or 'worse' (the
    seed-spread half of the rule is vacuous): 'lower_one_seed' / 'higher_one_seed'."""
    verdict = ladder.verdict_of(row["paired_bootstrap"], row["gap_bits_per_token"], row["seed_spread"])
    if len(row["seeds"]) == 1 and verdict != "level":
        return {"better": "lower_one_seed", "worse": "higher_one_seed"}[verdict]
    return verdict


def _sign_change(gaps):
    """log-N interpolation of the first size pair where the gap goes from > 0 to <= 0 (None if none)."""
    for (n0, g0), (n1, g1) in zip(gaps, gaps[1:]):
        if g0 > 0 >= g1:
            t = g0 / (g0 - g1)
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def _curve(rows):
    """One curve's crossover (rows of one width, or the preferred width's, sorted by size): its smallest 'better'
    size (more than one seed: ``verdict_code``), its smallest 'lower_one_seed' size (below by the paired interval
    alone), where the seed-mean gap (Transformer - n-gram bits/token) first changes sign, interpolated in log N,
    and the same from the best and the worst seed per size (the range)."""
    rows = sorted(rows, key=lambda r: r["size"])
    ng = {r["size"]: r["test_bits_per_token"]["mean"] - r["gap_bits_per_token"] for r in rows}
    mean = [(r["size"], r["gap_bits_per_token"]) for r in rows]
    best = [(r["size"], r["test_bits_per_token"]["min"] - ng[r["size"]]) for r in rows]
    worst = [(r["size"], r["test_bits_per_token"]["max"] - ng[r["size"]]) for r in rows]
    return {"first_better_size": next((r["size"] for r in rows if r["verdict"] == "better"), None),
            "first_below_one_seed": next((r["size"] for r in rows if r["verdict"] == "lower_one_seed"), None),
            "interpolated": _sign_change(mean), "range": [_sign_change(best), _sign_change(worst)],
            "gaps": [{"size": n, "gap": g} for n, g in mean], "sizes_run": [n for n, _ in mean],
            "below_at_smallest": bool(mean) and mean[0][1] <= 0}


def crossover(rows):
    """The crossover over every width: the smallest size at which some width is 'better' by the project's rule
    (more than one seed), and that width; its curve's interpolation and range (else the preferred width's).
    Beside it ``preferred``: the same for the width validation prefers at each size (it may have one seed, so
    it can only be 'lower_one_seed'), and ``by_width``.  Never crossed: no width better, no sign change, none
    below at its smallest size (the gaps' trend is on the page)."""
    widths = sorted({r["width"] for r in rows})
    by_width = {w: _curve([r for r in rows if r["width"] == w]) for w in widths}
    pref = _curve([r for r in rows if r.get("preferred_by_validation")])
    firsts = sorted((c["first_better_size"], w) for w, c in by_width.items() if c["first_better_size"])
    first, width = firsts[0] if firsts else (None, None)
    curve = by_width[width] if width else pref
    crossed = first is not None or any(c["interpolated"] or c["below_at_smallest"]
                                       for c in [pref, *by_width.values()])
    return dict(curve, first_better_size=first, first_better_width=width, curve="width " + width if width else
                "preferred", first_below_one_seed=pref["first_below_one_seed"], preferred=pref, by_width=by_width,
                never_crossed=not crossed)


# ----------------------------------------------------------------------------- the core check, speeds


def core_check(config, plan, sizes, recs, chosen, run):
    """The pure-Python core and the bridge are one model: the tutorial width at the smallest size, seed 0, per-token
    loss, no dropout, core_epochs epochs, trained once by transformer.train (pure Python, float64) and once by
    torch_bridge (float64, train_job); their test bits/token must agree to 1e-6 (the same trajectory).  Beside
    them the early-stopped float32 bridge seeds of the study (the recipe the page reports)."""
    import torch
    n = min(plan["widths"]["tutorial"])
    data = sizes[n]
    sub = {"ids": dict(data["ids"], train=data["ids"]["train"][:config.get("core_n", n)]), "vocab": data["vocab"],
           "smiles": data["smiles"]}
    cfg = dict(config, **WIDTHS["tutorial"], epochs=config["core_epochs"])

    def compute():
        t0 = time.perf_counter()
        model = make_model(cfg, len(data["vocab"]), 0)
        core.train(model, sub["ids"]["train"], core.lm_loss, epochs=cfg["epochs"], batch_size=cfg["batch_size"],
                   lr=cfg["lr"], warmup=cfg["warmup"], clip=cfg["clip"], seed=0, workers=2, tag="core",
                   loss_reduction="token", checkpoint=run.checkpoint(f"core_N{n}"))
        model.eval()
        nats = core.parallel_map(lambda x, rng: core.lm_loss(model, x, backward=False, reduction="sum")[0],
                                 sub["ids"]["test"], workers=2)
        n_tok = sum(len(x) - 1 for x in sub["ids"]["test"])
        core_s = time.perf_counter() - t0
        twin = ladder.train_job({"recipe": ladder.recipe("per_token", cfg, cfg["epochs"]), "seed": 0},
                                dict(sub, config=cfg, make_model=make_model, patience=None, dtype=torch.float64))
        return {"size": n, "n_train": len(sub["ids"]["train"]), "epochs": cfg["epochs"],
                "core_test_bits_per_token": math.fsum(nats) / LN2 / n_tok, "core_wall_time_s": core_s,
                "bridge_test_bits_per_token": twin["test_bits_per_token"], "bridge_engine": twin["engine"],
                "core_engine": "transformer.py (pure Python, float64)"}
    rec = run.resumable(f"core_check_N{n}", compute)
    rec["abs_diff"] = abs(rec["core_test_bits_per_token"] - rec["bridge_test_bits_per_token"])
    rec["agree"] = rec["abs_diff"] <= 1e-6
    rec["study_seeds"] = [r["test_bits_per_token"] for r in recs if r["width"] == "tutorial" and r["size"] == n
                          and r["dropout"] == chosen["tutorial"][str(n)]]
    return rec


def speeds(recs):
    """Measured training speed per job: molecules per second (epochs run x size / training wall time, the
    per-epoch validation scoring included) and the epochs early stopping ran."""
    return [{"width": r["width"], "size": r["size"], "seed": r["seed"], "rate": r["dropout"],
             "epochs_run": r["chosen"]["stopped_at"], "epoch_chosen": r["chosen"]["epoch"],
             "train_wall_time_s": r["train_wall_time_s"],
             "molecules_per_s": r["size"] * r["chosen"]["stopped_at"] / r["train_wall_time_s"]} for r in recs]


# ----------------------------------------------------------------------------- main


RESCORED = ("each row's verdict (verdict_code: one seed is never 'better') and the crossover recomputed from the "
            "stored fields (over every width: the smallest size some width with more than one seed is 'better')")


def rescore(payload):
    """--rescore: every row's verdict from its stored paired interval, gap and seed spread, and the crossover
    again (nothing is trained; a file written before the one-seed codes gains them)."""
    r = payload["results"]
    for row in r["rows"]:
        row.update(verdict=verdict_code(row), rule=VERDICT_RULE)
    r["crossover"] = crossover(r["rows"])


def extra_args(p):
    p.add_argument("--rescore", action="store_true",
                   help="recompute each row's verdict and the crossover of the existing results file (in --out, or "
                        "the default folder) from its stored fields, without training; recorded under 'updates'")


def main():
    args, config, run = common.start("data_hunger", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    if args.rescore:
        common.update_results(run.path, RESCORED, rescore)
        return run.log(f"updated {run.path}")
    plan = plan_of(run)
    stages, est = 6, stage_estimates(config, plan, run.speed_at_start)
    def stage(i, what):
        run.stage(i, stages, what, estimate_s=(est[i - 1], sum(est[i:])))
    stage(1, f"MOSES subsets {plan['sizes']}, {config['n_valid']} validation, {config['n_test']} test")
    sub, sizes, data = prepare(config, plan, run)
    stage(2, f"the n-gram at {plan['sizes']}")
    fits = core.parallel_map(lambda n, rng: run.resumable(f"ngram_N{n}", lambda: ngram_at(n, sizes[n], config)),
                             sorted(plan["sizes"], reverse=True), workers=2)       # largest first: two at a time
    ngrams = {str(g["size"]): g for g in sorted(fits, key=lambda g: g["size"])}
    for g in ngrams.values():
        n = g["size"]
        run.log(f"  n-gram N={n}: {g['variant']} n={g['n']} d={g['discount']} test {g['test_bits_per_token']:.3f} "
                f"bits/token, peak {g['peak_memory_mb']:.0f} MB, {g['wall_time_s']:.0f} s")
    stage(3, "the Transformer: " + "; ".join(f"{w} at {dict(by)}" for w, by in plan["widths"].items()))
    recs, chosen = transformer_stage(config, plan, sizes, run)
    stage(4, "the core check" if plan["core_check"] else "the core check (not in this mode)")
    check = core_check(config, plan, sizes, recs, chosen, run) if plan["core_check"] else None
    stage(5, f"sampling, {plan['n_samples']} per model")
    samples = sampling_stage(config, plan, sub, sizes, ngrams, chosen, run)
    stage(6, "verdicts and the crossover")
    rows = verdicts(plan, ngrams, recs, chosen)
    for r in rows:
        run.log(f"  N={r['size']} {r['width']}: {r['test_bits_per_token']['mean']:.3f} vs n-gram "
                f"{r['test_bits_per_token']['mean'] - r['gap_bits_per_token']:.3f}: {r['verdict']}")
    plan_rec = {k: ({w: {str(n): s for n, s in by.items()} for w, by in v.items()} if k == "widths" else
                    {str(n): x for n, x in v.items()} if isinstance(v, dict) else v) for k, v in plan.items()}
    run.finish({"plan": plan_rec, "data": data, "widths": WIDTHS, "ngram": ngrams, "rates": chosen,
                "transformer_runs": recs, "rows": rows,
                "crossover": crossover(rows), "core_check": check, "sampling": samples, "speeds": speeds(recs),
                "engine": recs[0]["engine"] if recs else None})


if __name__ == "__main__":
    main()
