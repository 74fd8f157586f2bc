"""Experiment 4 - a SMILES language model on ESOL, and chemically valid generation.

What it does
------------
* Data: ESOL (1128 molecules) with the scaffold split used everywhere (``chemdata.scaffold_split``,
  = DeepChem 2.8's ScaffoldSplitter: 902/113/113; the tutorial lists 902/112/114).  Atom-level tokens
  (``chemdata.tokenize_smiles``), <bos> ... <eos> around each molecule; <eos> is a supervised target.
* Vocabulary: the tutorial's 28 ids = 4 specials + the 24 most frequent training tokens; the rarer
  training symbols fall back to <unk> (which ones, and how often <unk> occurs per split, is reported).
* Model: TransformerLM d = 48, 4 heads, d_ff = 96, 2 layers, sine positions, tied embeddings
  (39,360 parameters with 28 ids), trained with ``transformer.train`` (lm_loss, Adam, warmup then
  inverse-sqrt decay, clip 1.0) for 6 epochs at batch size 8; checkpointed (resumable).
* Fit: bits/token, perplexity (2^bits) and next-token accuracy on train/valid/test (every target
  counts, <eos> included, <bos> never a target); test bits/token per length bucket (SMILES tokens
  <= 20, 21-32, 33-48, > 48) with the number of scored tokens; bits per character = the bits of a
  molecule (its <eos> included) / the characters of its SMILES, pooled over the split.
* Sampling: 200 molecules for each of 8 settings, tau in {0.5, 0.7, 1.0, 1.3} x {all tokens, top-k 5},
  decoded with the K/V cache through ``transformer.parallel_map`` (per-sample RNG from (seed, index),
  so the samples do not depend on the worker count), each setting once unrestricted and once with
  ``constraint=chemdata.SmilesConstraint(vocab, max_new_tokens=...)`` (grammar + valence state machine
  with a lenient Kekule check of aromatic systems while they grow and the exact one at '.' and <eos>,
  which also keeps every molecule closable within the token budget) and ``backtrack=50``: a dead end
  the mask could not foresee undoes the last token and draws again, at most 50 times per molecule, so
  a constrained sample is cut only when those undos are spent.  Scores:
  validity (RDKit parses the string), uniqueness = unique valid canonical SMILES / 200 (the tutorial's
  definition) and unique / valid, novelty = valid samples whose canonical SMILES is not a training
  molecule / valid (and the same over the unique ones), failure reasons
  (``chemdata.smiles_failure_reason``), stop reasons (eos / max_new_tokens / no_allowed_token).
* Speed: tokens/s of sampling with and without the cache, one process, on the same samples (the
  outputs must be identical: a check).
* Save: ``models/smiles_lm.json`` (``transformer.save_model``; meta holds the vocabulary and the
  split); QUICK runs save into <results folder>/models/ instead.
* ``--extended``: the same model size trained on SELFIES tokens of the same split (sampled the same
  way, scored after decoding to SMILES; bits per molecule beside the SMILES model's), and seeds 1, 2
  of the SMILES model (fit + all 16 sampling settings).

How to read results_smiles_lm.json (under "results")
----------------------------------------------------
data             split sizes, token counts, vocabulary (itos), unk_symbols, unk_counts per split
model            parameter count (reference 39,360), config, batch size, steps, train wall time
history          learning curves: steps (every few steps: step, loss, lr), epochs (train/valid loss)
fit              per split: bits_per_token, perplexity, token_accuracy, n_tokens, bits_per_char,
                 bits_per_molecule; fit.test_buckets: [{bucket, n_molecules, n_tokens, bits_per_token}]
sampling         list of 16 settings: {temperature, top_k, constrained, n, validity, uniqueness,
                 uniqueness_of_valid, novelty, novelty_unique, failures {reason: count} (all samples),
                 failures_after_eos (only the samples that ended with <eos>, not cut at the limit),
                 stop_reasons, mean_length, samples [strings]}
speed            cached / uncached tokens per second (one process), speedup; sampling_wall_time_s
extended         (with --extended) selfies: {data, fit, sampling}, seeds: {seed: {fit, sampling}}
checks           self-checks that must all be True
reading          one paragraph generated from the numbers

Run:  python demos/demo_smiles_lm.py             (default: about 10 min training + 3 min sampling on 2 cores)
      python demos/demo_smiles_lm.py --extended  (+ SELFIES model and seeds 1, 2: about 45 min)
      QUICK=1 python demos/demo_smiles_lm.py     (smoke run, about a minute; numbers meaningless)
"""
import math
import os
import time

import common

tf = common.tf
import chemdata  # noqa: E402  (common puts the project root on sys.path)
import readings  # noqa: E402  (demos/readings.py: the reading, shared with make_figures.py)

LN2 = math.log(2.0)
BUCKETS = ((0, 20, "<=20"), (21, 32, "21-32"), (33, 48, "33-48"), (49, 10 ** 9, ">48"))
TEMPERATURES = (0.5, 0.7, 1.0, 1.3)
TOP_KS = (None, 5)
GRAMMAR = ("unbalanced_branch", "unclosed_ring", "unk")       # what the constraint must never let through

FULL = dict(vocab_size=28, d_model=48, n_heads=4, d_ff=96, n_layers=2, pos="sine", tie_weights=True,
            epochs=6, batch_size=8, lr=3e-3, warmup=100, clip=1.0, n_samples=200, max_new_tokens=100,
            backtrack=50, n_speed=10, curve_every=5, extended_seeds=(1, 2))
QUICK_OVERRIDES = dict(epochs=1, n_train=64, n_eval=24, n_samples=6, max_new_tokens=40, n_speed=2,
                       extended_seeds=(1,))


# ----------------------------------------------------------------------------- data


def load_split(config):
    """ESOL smiles and the scaffold split (train, valid, test) as lists of SMILES."""
    esol = chemdata.load_esol()
    idx = chemdata.scaffold_split(esol.smiles)
    parts = [[esol.smiles[i] for i in part] for part in idx]
    if "n_train" in config:                       # QUICK: an evenly spaced subset of each split (the split
        sizes = (config["n_train"], config["n_eval"], config["n_eval"])  # starts with all acyclic molecules)
        parts = [p[::max(1, len(p) // n)][:n] for p, n in zip(parts, sizes)]
    return dict(zip(("train", "valid", "test"), parts))


def build_vocab(train_tokens, size):
    """The tutorial's vocabulary: the size - 4 most frequent training tokens (ties alphabetical)."""
    counts = chemdata.Counter(t for tokens in train_tokens for t in tokens)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    keep = ranked[:size - len(chemdata.Vocab.SPECIALS)]
    vocab = chemdata.Vocab(keep)
    vocab.counts = {t: counts[t] for t in keep}
    return vocab, {t: counts[t] for t in ranked[len(keep):]}


def encode_splits(tokens, vocab):
    """{split: [ids]} and the <unk> count per split."""
    ids, unk = {}, {}
    for name, lists in tokens.items():
        before = vocab.unk_count
        ids[name] = [vocab.encode(t) for t in lists]
        unk[name] = vocab.unk_count - before
    return ids, unk


# ----------------------------------------------------------------------------- fit


def score_molecule(model, ids):
    """(nll nats per target, correct flags) of one encoded molecule (targets ids[1:])."""
    logits = model.forward(ids[:-1])
    nll, hits = [], []
    for row, y in zip(logits, ids[1:]):
        lp = tf.log_softmax(row)
        nll.append(-lp[y])
        hits.append(max(range(len(row)), key=row.__getitem__) == y)
    return nll, hits


def evaluate(model, ids, smiles, seed):
    """Fit metrics of one split: token-weighted bits/token, perplexity, accuracy, bits/char, bits/molecule."""
    scored = tf.parallel_map(lambda i, rng: score_molecule(model, ids[i]), range(len(ids)), seed=seed)
    n_tok = sum(len(n) for n, _ in scored)
    bits = sum(map(math.fsum, (n for n, _ in scored))) / LN2
    rec = {"n_molecules": len(ids), "n_tokens": n_tok, "bits_per_token": bits / n_tok,
           "perplexity": 2 ** (bits / n_tok), "token_accuracy": sum(sum(h) for _, h in scored) / n_tok,
           "bits_per_char": bits / sum(len(s) for s in smiles), "bits_per_molecule": bits / len(ids)}
    return rec, scored


def bucket_table(scored, token_lists):
    """Test bits/token per length bucket (length = SMILES tokens of the molecule)."""
    rows = []
    for lo, hi, name in BUCKETS:
        members = [s for s, t in zip(scored, token_lists) if lo <= len(t) <= hi]
        n_tok = sum(len(n) for n, _ in members)
        bits = sum(math.fsum(n) for n, _ in members) / LN2
        rows.append({"bucket": name, "n_molecules": len(members), "n_tokens": n_tok,
                     "bits_per_token": bits / n_tok if n_tok else None})
    return rows


def fit_all(model, ids, splits, tokens, seed, run):
    fit = {}
    for name in ("train", "valid", "test"):
        fit[name], scored = evaluate(model, ids[name], splits[name], seed)
        run.log(f"  {name}: {fit[name]['bits_per_token']:.3f} bits/token, perplexity "
                f"{fit[name]['perplexity']:.2f}, accuracy {fit[name]['token_accuracy']:.3f}")
        if name == "test":
            fit["test_buckets"] = bucket_table(scored, tokens["test"])
    return fit


# ----------------------------------------------------------------------------- training


def make_model(config, vocab_size, seed):
    return tf.TransformerLM(vocab_size, d_model=config["d_model"], n_heads=config["n_heads"],
                            n_layers=config["n_layers"], d_ff=config["d_ff"], pos=config["pos"],
                            tie_weights=config["tie_weights"], seed=seed)


def train_model(config, vocab_size, ids, seed, run, tag, workers):
    """Train one LM; returns (model, history summary)."""
    model = make_model(config, vocab_size, seed)
    hist = tf.train(model, ids["train"], tf.lm_loss, valid_data=ids["valid"], epochs=config["epochs"],
                    batch_size=config["batch_size"], lr=config["lr"], warmup=config["warmup"],
                    clip=config["clip"], seed=seed, workers=workers, tag=tag,
                    checkpoint=run.checkpoint(tag))
    every = config["curve_every"]
    steps = [{"step": s["step"], "loss": s["loss"], "lr": s["lr"]} for i, s in enumerate(hist["steps"])
             if i % every == 0 or i == len(hist["steps"]) - 1]
    epochs = [{k: e[k] for k in ("epoch", "train_loss", "valid_loss", "elapsed") if k in e}
              for e in hist["epochs"]]
    return model, {"steps": steps, "epochs": epochs, "n_steps": hist["n_steps"],
                   "wall_time_s": hist["wall_time"]}


# ----------------------------------------------------------------------------- sampling


def settings(constrained_too=True):
    out = [dict(temperature=t, top_k=k, constrained=False) for t in TEMPERATURES for k in TOP_KS]
    if constrained_too:
        out += [dict(s, constrained=True) for s in out]
    return out


def sample_all(model, vocab, config, setting_list, seed, constraint_factory=None, tag="sample"):
    """Every setting's samples in one parallel_map; returns ([[(tokens, reason)] per setting], wall s)."""
    n = config["n_samples"]
    constraint = constraint_factory() if constraint_factory else None
    items = [(k, i) for k in range(len(setting_list)) for i in range(n)]

    def draw(item, rng):
        s = setting_list[item[0]]
        new, reason = tf.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=s["temperature"],
                                  top_k=s["top_k"], rng=rng, eos_id=vocab.eos_id,
                                  constraint=constraint if s["constrained"] else None,
                                  backtrack=config["backtrack"] if s["constrained"] else 0, return_reason=True)
        return vocab.decode(new), reason

    t0 = time.perf_counter()
    out = tf.parallel_map(draw, items, seed=seed, progress=tag)
    wall = time.perf_counter() - t0
    return [out[k * n:(k + 1) * n] for k in range(len(setting_list))], wall


def score_samples(samples, train_canonical, to_smiles):
    """Validity, uniqueness, novelty, failure and stop reasons of one setting's samples."""
    strings = [to_smiles(tokens) for tokens, _ in samples]
    canon = [chemdata.canonical_smiles(s) if s and "<unk>" not in s else None for s in strings]
    valid = [c for c in canon if c]
    unique = set(valid)
    n = len(samples)
    fails = chemdata.Counter(chemdata.smiles_failure_reason(s) for s, c in zip(strings, canon) if not c)
    return {"n": n, "n_valid": len(valid), "validity": len(valid) / n, "n_unique_valid": len(unique),
            "uniqueness": len(unique) / n, "uniqueness_of_valid": len(unique) / len(valid) if valid else None,
            "novelty": sum(c not in train_canonical for c in valid) / len(valid) if valid else None,
            "novelty_unique": len(unique - train_canonical) / len(unique) if unique else None,
            "failures": {r: fails.get(r, 0) for r in chemdata.FAILURE_REASONS},
            "failures_after_eos": dict(chemdata.Counter(chemdata.smiles_failure_reason(s) for s, c, (_, r)
                                                        in zip(strings, canon, samples) if not c and r == "eos")),
            "stop_reasons": dict(chemdata.Counter(r for _, r in samples)),
            "mean_length": sum(len(t) for t, _ in samples) / n, "samples": strings}


def sampling_rows(model, vocab, config, train_canonical, seed, run, to_smiles=None, constrained_too=True,
                  tag="sample"):
    to_smiles = to_smiles or (lambda tokens: "".join(tokens))
    setting_list = settings(constrained_too)
    budget = config["max_new_tokens"]      # the constraint also ends every molecule within the token budget
    factory = (lambda: chemdata.SmilesConstraint(vocab, max_new_tokens=budget)) if constrained_too else None
    per_setting, wall = sample_all(model, vocab, config, setting_list, seed, factory, tag)
    rows = []
    for s, samples in zip(setting_list, per_setting):
        rec = dict(s, **score_samples(samples, train_canonical, to_smiles))
        rows.append(rec)
        run.log(f"  tau {s['temperature']} top-k {s['top_k']} {'constrained' if s['constrained'] else 'free':>11}: "
                f"validity {rec['validity']:.3f} uniqueness {rec['uniqueness']:.3f} "
                f"novelty {rec['novelty'] if rec['novelty'] is None else round(rec['novelty'], 3)} "
                f"failures { {k: v for k, v in rec['failures'].items() if v} }")
    return rows, wall


def speed_test(model, vocab, config, seed):
    """Tokens/s of one process sampling the same molecules with and without the K/V cache."""
    n, out = config["n_speed"], {}
    for cached in (True, False):
        t0, seqs = time.perf_counter(), []
        for i in range(n):
            seqs.append(tf.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=1.0,
                                    rng=seed * 1000 + i, eos_id=vocab.eos_id, use_cache=cached))
        wall = time.perf_counter() - t0
        n_tok = sum(len(s) + 1 for s in seqs)                    # + the <eos> step
        out["cached" if cached else "uncached"] = {"n_sequences": n, "n_tokens": n_tok, "wall_time_s": wall,
                                                   "tokens_per_s": n_tok / wall, "sequences": seqs}
    out["speedup"] = out["cached"]["tokens_per_s"] / out["uncached"]["tokens_per_s"]
    out["identical"] = out["cached"].pop("sequences") == out["uncached"].pop("sequences")
    return out


# ----------------------------------------------------------------------------- extended


def selfies_tokens(splits):
    return {k: [chemdata.tokenize_selfies(chemdata.smiles_to_selfies(s)) for s in v] for k, v in splits.items()}


def selfies_to_string(tokens):
    """A sampled SELFIES token list -> SMILES ('' if it holds <unk>, so it counts as invalid 'unk')."""
    if "<unk>" in tokens:
        return "<unk>"
    return chemdata.selfies_to_smiles("".join(tokens))


def run_selfies(config, splits, train_canonical, run, workers):
    tokens = selfies_tokens(splits)
    vocab = chemdata.Vocab.build(tokens["train"])
    ids, unk = encode_splits(tokens, vocab)
    model, hist = train_model(config, len(vocab), ids, 0, run, "selfies_seed0", workers)
    fit = fit_all(model, ids, splits, tokens, 0, run)
    rows, wall = sampling_rows(model, vocab, config, train_canonical, 0, run, to_smiles=selfies_to_string,
                               constrained_too=False, tag="sample selfies")
    return {"data": {"vocab_size": len(vocab), "itos": vocab.itos, "unk_counts": unk,
                     "n_tokens": {k: sum(map(len, v)) for k, v in tokens.items()}},
            "model": {"parameters": tf.param_count(model)}, "history": hist, "fit": fit, "sampling": rows,
            "sampling_wall_time_s": wall}


def run_seed(seed, config, vocab, ids, splits, tokens, train_canonical, run, workers):
    model, hist = train_model(config, len(vocab), ids, seed, run, f"smiles_seed{seed}", workers)
    fit = fit_all(model, ids, splits, tokens, seed, run)
    rows, wall = sampling_rows(model, vocab, config, train_canonical, seed, run, tag=f"sample seed {seed}")
    for r in rows:
        r.pop("samples")                                         # the seed-0 samples are the stored ones
    return {"history": {"epochs": hist["epochs"], "n_steps": hist["n_steps"], "wall_time_s": hist["wall_time_s"]},
            "fit": fit, "sampling": rows, "sampling_wall_time_s": wall}


# ----------------------------------------------------------------------------- report


def model_path(run):
    folder = os.path.join(run.out_dir, "models") if common.QUICK else os.path.join(common.ROOT, "models")
    return os.path.join(folder, "smiles_lm.json")


def prepare_data(config, run):
    """Stage 1: the split, its atom tokens, the vocabulary and the encoded splits, and the data record."""
    splits = load_split(config)
    tokens = {k: [chemdata.tokenize_smiles(s) for s in v] for k, v in splits.items()}
    vocab, unk_symbols = build_vocab(tokens["train"], config["vocab_size"])
    ids, unk = encode_splits(tokens, vocab)
    run.log(f"  split {[len(v) for v in splits.values()]}, <unk> symbols {unk_symbols}, <unk> per split {unk}")
    data = {"split_sizes": {k: len(v) for k, v in splits.items()}, "vocab_size": len(vocab), "itos": vocab.itos,
            "unk_symbols": unk_symbols, "unk_counts": unk,
            "n_tokens": {k: sum(len(t) + 1 for t in v) for k, v in tokens.items()}}
    return splits, tokens, vocab, ids, data


def save_and_reload(model, vocab, fit, seed, run):
    """Save the model with its vocabulary (experiment 5 loads it) and read it back: (path, reloaded)."""
    path = model_path(run)
    tf.save_model(model, path, meta={"vocab": vocab.itos, "tokenizer": "chemdata.tokenize_smiles",
                                     "split": "chemdata.scaffold_split(ESOL)", "seed": seed,
                                     "test_bits_per_token": fit["test"]["bits_per_token"],
                                     "git_commit": run.git_commit, "mode": run.mode})
    return path, tf.load_model(path)


def run_extended(config, splits, vocab, ids, tokens, train_canonical, run, workers, n_stages):
    """Stages 6-7 of --extended: the SELFIES model, then the extra seeds."""
    run.stage(6, n_stages, "extended: SELFIES model (same size, same split)")
    extended = {"selfies": run_selfies(config, splits, train_canonical, run, workers)}
    run.stage(7, n_stages, f"extended: seeds {list(config['extended_seeds'])}")
    extended["seeds"] = {str(s): run_seed(s, config, vocab, ids, splits, tokens, train_canonical, run, workers)
                         for s in config["extended_seeds"]}
    return extended


def checks(model, reloaded, vocab, config, rows, speed, n_params):
    """The booleans of the smoke tests: reference size, save/load, cache, grammar, every sample stored."""
    probe = [vocab.bos_id, vocab.stoi.get("C", 4)]
    con_rows = [r for r in rows if r["constrained"]]
    return {
        "parameter_count_is_reference": n_params == 39360 if len(vocab) == 28 else True,
        "reloaded_model_samples_identically": tf.generate(model, probe, 20, rng=7) == tf.generate(reloaded, probe, 20, rng=7),
        "cached_equals_uncached": speed["identical"],
        "constrained_never_unbalanced": all(not set(r["failures_after_eos"]) & set(GRAMMAR) for r in con_rows),
        "every_sample_stored": all(len(r["samples"]) == config["n_samples"] for r in rows),
    }


def main():
    args, config, run = common.start("smiles_lm", __doc__, FULL, QUICK_OVERRIDES)
    n_stages = 6 + (2 if run.extended else 0)
    run.stage(1, n_stages, "data: ESOL scaffold split, atom tokens, 28-id vocabulary")
    splits, tokens, vocab, ids, data = prepare_data(config, run)
    train_canonical = {chemdata.canonical_smiles(s) for s in splits["train"]}

    run.stage(2, n_stages, f"training the LM ({config['epochs']} epochs, batch {config['batch_size']})")
    model, hist = train_model(config, len(vocab), ids, args.seed, run, f"smiles_seed{args.seed}", args.workers)
    n_params = tf.param_count(model)
    run.log(f"  {n_params:,} parameters (reference 39,360), {hist['n_steps']} steps, "
            f"{common.fmt_time(hist['wall_time_s'])}")

    run.stage(3, n_stages, "fit: bits/token, perplexity, accuracy per split")
    fit = fit_all(model, ids, splits, tokens, args.seed, run)
    path, reloaded = save_and_reload(model, vocab, fit, args.seed, run)

    run.stage(4, n_stages, f"sampling: 16 settings x {config['n_samples']} molecules (K/V cache, parallel_map)")
    rows, wall = sampling_rows(model, vocab, config, train_canonical, args.seed, run)

    run.stage(5, n_stages, "speed: cached vs uncached sampling, one process")
    speed = speed_test(model, vocab, config, args.seed)
    speed["sampling_wall_time_s"] = wall
    run.log(f"  cached {speed['cached']['tokens_per_s']:.0f} tokens/s, uncached "
            f"{speed['uncached']['tokens_per_s']:.0f} tokens/s ({speed['speedup']:.1f}x)")

    results = {"data": data, "model": {"parameters": n_params, "reference_parameters": 39360,
                                       "config": model.config, "batch_size": config["batch_size"],
                                       "n_steps": hist["n_steps"], "train_wall_time_s": hist["wall_time_s"],
                                       "path": os.path.relpath(path, common.ROOT)},
               "history": hist, "fit": fit, "sampling": rows, "speed": speed}
    if run.extended:
        results["extended"] = run_extended(config, splits, vocab, ids, tokens, train_canonical, run, args.workers,
                                           n_stages)

    run.stage(n_stages, n_stages, "checks and reading")
    results["checks"] = checks(model, reloaded, vocab, config, rows, speed, n_params)
    results["reading"] = readings.smiles_lm(results)          # the same paragraph as the README's
    run.log(results["reading"])
    run.finish(results)


if __name__ == "__main__":
    main()
