"""Experiment 4 (the tutorial's section 10.4) - a SMILES language model on ESOL, and chemically valid
generation, trained by transformer.train with the optimiser of the section 6.5 recipe (Adam, warmup, clipping;
the settings that differ are on the page).

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
* Sampling: 200 molecules for each of 8 settings, tau in {0.5, 0.7, 1.0, 1.3} x {all tokens, top-k 5}
  (the tau 1.0 ones, free and constrained, 2,000 each: ``n_headline``; 10,000 under --extended),
  decoded with the K/V cache through ``transformer.parallel_map``, each sample from its own random stream
  (``setting_stream``: keyed by the model, seed, tau, top-k, free/constrained and its index in the setting, so
  the samples depend neither on the worker count nor on the other settings' counts: a default run's 2,000
  are the first 2,000 of an --extended run's 10,000), each setting once unrestricted and once with
  ``constraint=smiles_grammar.SmilesConstraint(vocab, max_new_tokens=budget, close_on_eos=True)`` (budget:
  ``length_budget`` of the training molecules, never below the longest of them, capped at generate's 100;
  ``close_on_eos=True``: when the model chooses <eos> where the molecule cannot end yet, it is closed from
  there, the model choosing among the closings, instead of sampling on around the masked <eos>; the
  candidate (CANDIDATE_OPTIONS: + ``max_ring_size``, no ring larger than training's largest, + ``lookahead``,
  a token only if a bounded search finds a completion after it) is sampled under --extended on every
  constrained setting with the same draws, and becomes the headline once it meets the page's targets; grammar +
  valence state machine
  with a lenient Kekule check of aromatic systems while they grow and the exact one at '.' and <eos>,
  which also keeps every molecule closable within the token budget) and ``backtrack=50``: a dead end
  the mask could not foresee undoes the last token and draws again, at most 50 times per molecule, so
  a constrained sample is cut only when those undos are spent.  Scores:
  validity = valid / n (a sample that did not end with <eos> is invalid, reason 'no_eos', whatever RDKit
  says of the prefix), uniqueness = unique valid / n and novelty = novel unique / unique valid (the
  tutorial's definitions, ``generation_metrics.tutorial_novelty``), novelty_of_valid = novel valid / valid (ours),
  failure reasons (``smiles_grammar.smiles_failure_reason``), and per sample its stop reason (eos /
  max_new_tokens / no_allowed_token), token count and (constrained) undo and forced-closure counts;
  tokens/s per setting (summed per-sample decoding time, one process each).
* n-gram baseline (``generation_metrics.fit_ngram``): interpolated or modified Kneser-Ney on the same ids, the variant,
  n in 2..20 and the discount (modified: a scale of the estimated discounts) chosen on valid, the choice
  checked to be interior to the grid; bits/token per split, a paired bootstrap of bits/molecule against the
  Transformer over the test molecules, sampled through the same ``generate`` (``next_logits``) at the
  tau 1.0 settings, free and constrained (1,000 samples each; 2,000 under --extended: for time).
* Distribution (``generation_metrics.distribution_metrics``, against the training split): GuacaMol KL score
  (``KLDivBenchmark``), FCD and its score exp(-0.2 FCD) (``fcd``), MOSES-style IntDiv1 / SNN / Frag / Scaf,
  token-length histogram and share >= 90 tokens, for the tau 1.0 settings of both models and the
  reference rows: the training split resampled (2,000 draws) and the test split.  Needs guacamol and
  fcd (``generation_metrics.GUACAMOL_HINT``); without them the table says why it is absent.
* Speed: tokens/s of sampling with and without the cache, one process, on the same samples (the
  outputs must be identical: a check).
* Save: ``models/smiles_lm.json`` (``transformer.save_model``; meta holds the vocabulary and the
  split); QUICK runs save into <results folder>/models/ instead.
* ``--extended``: the same model size trained on SELFIES tokens of the same split (sampled the same
  way, scored after decoding to SMILES; bits per molecule beside the SMILES model's), seeds 1, 2
  of the SMILES model (fit + all 16 sampling settings), and the recipe ladder (``smiles_lm_ladder``: per-token
  loss, early stopping, dropout, randomized-SMILES augmentation, 3 seeds a rung, each paired against the n-gram).

How to read results_smiles_lm.json (under "results")
----------------------------------------------------
data             split sizes, token counts, vocabulary (itos), unk_symbols, unk_counts per split, train_shape
                 (the training molecules' heavy-atom and ring-count histograms, max_ring)
model            parameter count (reference 39,360), config, batch size, steps, train wall time
history          learning curves: steps (every few steps: step, loss, lr), epochs (train/valid loss)
fit              per split: bits_per_token, perplexity, token_accuracy, n_tokens, bits_per_char,
                 bits_per_molecule; fit.test_buckets: [{bucket, n_molecules, n_tokens, bits_per_token}]
sampling         list of 16 settings: {temperature, top_k, constrained, n, n_valid, n_unique_valid,
                 validity, uniqueness, novelty (the tutorial's), novelty_of_valid (ours),
                 uniqueness_of_valid, failures {reason: count} (all samples; no_eos first),
                 failures_after_eos (only the samples that ended with <eos>), stop_reason_counts,
                 mean_length, mean_length_valid, decode_time_s, tokens_per_s, and aligned per-sample
                 lists samples [strings], stop_reasons, n_tokens (+ undos, forced_closures, forced if
                 constrained, with forced_share, validity_not_forced, closed_on_eos_share and own_eos_share:
                 ended by the model's own <eos>, neither closed at its request nor forced; shape_by_ending
                 {own <eos> | closed at <eos> | forced: shape of those valid samples}); validity_by_length
                 [{bin, n, valid, validity}]; shape (valid samples: mean_heavy_atoms, heavy_atoms_hist, ring_count_hist,
                 share_ring_larger_than the training maximum, ks_heavy_atoms, ks_rings against training);
                 settings with more samples than the others (tau 1.0) also at_tutorial_n {size, blocks,
                 validity|uniqueness|novelty: {mean, sd}}: the scores per block of the tutorial's 200
                 samples (uniqueness falls and novelty rises with n, so these are the like-for-like ones)}
sampling_sizes   headline / other n, the headline (tau, top_k) settings, constraint_budget
ngram            variant, n, discount, discounts (per order), interior {n_interior, discount_interior}, grid
                 (valid bits/token of each setting tried), fit {split: bits_per_token,
                 test_molecule_bits}, paired_bootstrap (Transformer - n-gram bits/molecule), sampling
distribution     available, versions {guacamol, fcd}, rows [{source, temperature, top_k, constrained |
                 reference, n, n_valid, kl {score, number_samples, kl_divergences}, kl_at_size {size,
                 repeats, mean, sd, scores} (the KL score at the test split's size,
                 generation_metrics.kl_score_at_size: the like-for-like one), fcd {fcd, score}, int_div1, snn, frag,
                 scaf, length_histogram, share_long, mean_tokens, examples}],
                 train_length_histogram
speed            cached / uncached tokens per second (one process), speedup; sampling_wall_time_s
extended         (with --extended) selfies: {data, fit, sampling, distribution}, seeds: {seed: {fit,
                 sampling (no per-sample lists), distribution (2,000 per headline setting)}}
constraint_probe (with --extended) the constraint's parts one at a time (PROBES), tau 1.0, seed 0's model:
                 [{label, budget, options, n, validity, forced_share, validity_by_length, shape, ...}]
constraint_candidate (--extended, --add-candidate) every constrained setting under CANDIDATE_OPTIONS, the same
                 draws: options, rows (as sampling's, no per-sample lists; the headline settings' also paired_shape:
                 {ks_heavy_atoms, ks_rings: candidate - headline, paired bootstrap over the streams}), distribution
                 (headline rows), wall_time_s
ladder           (with --extended) the recipe ladder (demos/smiles_lm_ladder.py): runs [{rung, seed, dropout,
                 recipe, curve, chosen epoch, valid/test bits_per_token, test_molecule_bits, engine}], dropout_rate
                 and rate_table, rungs [{rung, test_bits_per_token {mean, min, max, seeds}, paired_bootstrap
                 (pooled over seeds), per_seed, gap_bits_per_token, seed_spread, verdict}], first_better,
                 best_rung, best_sampling (its seed-0 tau 1.0 rows and distribution), tutorial_rung_check
checks           self-checks that must all be True
reading          one paragraph generated from the numbers

Run:  python demos/demo_smiles_lm.py             (default: 12.6 min in the main job at 040bd9c, 2 cores,
                                                  Python 3.11, host at 108 Mflop/s: training 4.6 min,
                                                  sampling 5.6 min)
      python demos/demo_smiles_lm.py --extended  (+ 10,000 per headline setting, SELFIES, seeds 1, 2, the recipe
                                                  ladder and the constraint probe: 72.4 min at 475b61a, before the
                                                  candidate's stage (its own time: the file's --add-candidate), 2 cores,
                                                  host at 65 Mflop/s with other work beside it; the ladder
                                                  itself 4.7 min through torch_bridge)
      python demos/demo_smiles_lm.py --add-probe (the probe rows an --extended results file lacks, from the
                                                  saved seed-0 model; recorded under "updates")
      python demos/demo_smiles_lm.py --add-candidate  (every constrained setting under the candidate constraint,
                                                  into an --extended results file from its saved model, replacing
                                                  any candidate rows; recorded under "updates")
      QUICK=1 python demos/demo_smiles_lm.py     (smoke run, about a minute; numbers meaningless)

An interrupted run (Ctrl-C, a killed job) continues where it stopped when the same command is run again:
each training from its checkpoint, and each finished stage (seed 0's sampling, the n-gram, the distribution
metrics, the SELFIES model, each extra seed) from its file in checkpoints/smiles_lm/ (``Run.resumable``;
the results then list them under ``resumed_stages``).
"""
import functools
import math
import os
import time

import common

core = common.core
import chemdata  # noqa: E402  (common puts the project root on sys.path)
import evaluation  # noqa: E402  (imported after the sys.path set-up above)
import generation_metrics  # noqa: E402  (imported after the sys.path set-up above)
import smiles_grammar  # noqa: E402  (imported after the sys.path set-up above)
import report_kit  # noqa: E402  (number formatting)
import report_smiles_lm  # noqa: E402  (demos/report_smiles_lm.py: the reading, the same as on the page)
import smiles_lm_ladder  # noqa: E402  (demos/smiles_lm_ladder.py: the recipe ladder of --extended)

LN2 = math.log(2.0)
BUCKETS = ((0, 20, "<=20"), (21, 32, "21-32"), (33, 48, "33-48"), (49, 10 ** 9, ">48"))
TEMPERATURES = (0.5, 0.7, 1.0, 1.3)
TOP_KS = (None, 5)
GRAMMAR = ("unbalanced_branch", "unclosed_ring", "unk")       # what the constraint must never let through

HEADLINE = ((1.0, None), (1.0, 5))     # (tau, top_k) sampled n_headline times, free and constrained
LONG_TOKENS = 90                         # the share of valid samples this long or longer is reported
KL_REPEATS = 5                           # KL score at the test split's size: mean over this many subsets
SMILES_STREAM = "SMILES Transformer"     # the SMILES models' samples' stream name (every seed; the probe too)

FULL = dict(vocab_size=28, d_model=48, n_heads=4, d_ff=96, n_layers=2, pos="sine", tie_weights=True,
            epochs=6, batch_size=8, lr=3e-3, warmup=100, clip=1.0, n_samples=200, n_headline=2000, n_ngram=1000,
            max_new_tokens=100, backtrack=50, n_speed=10, curve_every=5, extended_seeds=(1, 2),
            constraint_options={"close_on_eos": True}, n_probe=1000)
EXTENDED_HEADLINE = 10000                # --extended: the seed-0 headline settings (and SELFIES) this many
EXTENDED_NGRAM = 2000                    # --extended: the n-gram's headline settings this many (default n_ngram)
QUICK_OVERRIDES = dict(epochs=1, n_train=64, n_eval=24, n_samples=6, n_headline=12, n_ngram=12, max_new_tokens=40,
                       n_speed=2, extended_seeds=(1,), n_probe=8)


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
        lp = core.log_softmax(row)
        nll.append(-lp[y])
        hits.append(max(range(len(row)), key=row.__getitem__) == y)
    return nll, hits


def evaluate(model, ids, smiles, seed):
    """Fit metrics of one split: token-weighted bits/token, perplexity, accuracy, bits/char, bits/molecule."""
    scored = core.parallel_map(lambda i, rng: score_molecule(model, ids[i]), range(len(ids)), seed=seed)
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
            fit["test_molecule_bits"] = [math.fsum(n) / LN2 for n, _ in scored]   # for the paired n-gram test
    return fit


# ----------------------------------------------------------------------------- training


def make_model(config, vocab_size, seed, dropout=0.0):
    """The tutorial's LM shape; ``dropout`` > 0 only for the recipe ladder's rungs (off in the tutorial's rows)."""
    extra = {"dropout": dropout} if dropout else {}
    return core.TransformerLM(vocab_size, d_model=config["d_model"], n_heads=config["n_heads"],
                            n_layers=config["n_layers"], d_ff=config["d_ff"], pos=config["pos"],
                            tie_weights=config["tie_weights"], seed=seed, **extra)


def train_model(config, vocab_size, ids, seed, run, tag, workers):
    """Train one LM; returns (model, history summary)."""
    model = make_model(config, vocab_size, seed)
    hist = core.train(model, ids["train"], core.lm_loss, valid_data=ids["valid"], epochs=config["epochs"],
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


# ----------------------------------------------------------------------------- the training reference


class TrainingSet(frozenset):
    """The training split's canonical SMILES (a set: novelty is membership) with its molecules' shape
    (``shape``: heavy atoms and ring counts per molecule and the largest ring), what samples are held against."""

    @classmethod
    def of(cls, smiles):
        out = cls({chemdata.canonical_smiles(s) for s in smiles} - {None})
        shapes = [x for x in map(generation_metrics.molecule_shape, smiles) if x]
        out.shape = {"heavy_atoms": [x["heavy_atoms"] for x in shapes], "rings": [x["rings"] for x in shapes],
                     "max_ring": max(x["largest_ring"] for x in shapes), "n": len(shapes)}
        return out


def _expand(hist):
    return [int(k) for k, n in hist.items() for _ in range(n)]


def shape_record(valid_smiles, reference):
    """The valid samples' shape against the training molecules': generation_metrics.shape_summary (heavy-atom and
    ring-count histograms, the share with a ring larger than the training maximum) and the two-sample KS
    statistics of heavy atoms and ring counts (None without valid samples)."""
    ref = getattr(reference, "shape", None)
    if ref is None:
        return None
    rec = generation_metrics.shape_summary(valid_smiles, train_max_ring=ref["max_ring"])
    heavy, rings = _expand(rec["heavy_atoms_hist"]), _expand(rec["ring_count_hist"])
    rec["ks_heavy_atoms"] = generation_metrics.ks_statistic(heavy, ref["heavy_atoms"]) if heavy else None
    rec["ks_rings"] = generation_metrics.ks_statistic(rings, ref["rings"]) if rings else None
    return rec


# ----------------------------------------------------------------------------- sampling


def settings(config, constrained_too=True, n_headline=None, headline_only=False):
    """The 8 (tau, top-k) settings, free (and constrained); the HEADLINE ones hold n_headline samples."""
    out = [dict(temperature=t, top_k=k, constrained=False) for t in TEMPERATURES for k in TOP_KS
           if not headline_only or (t, k) in HEADLINE]
    if constrained_too:
        out += [dict(s, constrained=True) for s in out]
    big = n_headline or config["n_headline"]
    return [dict(s, n=big if (s["temperature"], s["top_k"]) in HEADLINE else config["n_samples"]) for s in out]


def setting_stream(stream, seed, s, index):
    """The random stream of sample ``index`` of setting ``s``: a function of the model's stream name, the seed,
    the setting (tau, top-k, free or constrained) and the index alone (``core.keyed_rng``), so a setting draws the
    same samples whatever settings ran before it and whatever their counts: n samples are the first n of any
    larger n.  The constraint's options are not in the key: the probe's variants share one stream (common
    random numbers: their rows differ by the constraint, not by the draws)."""
    return core.keyed_rng("sample", stream, seed, float(s["temperature"]), s["top_k"], bool(s["constrained"]),
                          index)


def sample_all(model, vocab, config, setting_list, seed, constraint_factory=None, tag="sample", *, stream):
    """Every setting's samples in one parallel_map (``model``: a TransformerLM or anything with
    ``next_logits``, the n-gram); returns ([[(tokens, reason, seconds, stats)] per setting], wall s).
    ``stats``: the constraint's per-sample counters (undos, forced closures) when it exposes them.  Each
    sample draws from ``setting_stream(stream, seed, setting, index)``, not parallel_map's flat-index rng;
    ``stream`` names the model ("SMILES Transformer", "n-gram", ...)."""
    constraint = constraint_factory() if constraint_factory else None
    items = [(k, i) for k, s in enumerate(setting_list) for i in range(s["n"])]

    def draw(item, _flat_rng):
        s = setting_list[item[0]]
        rng = setting_stream(stream, seed, s, item[1])
        con = constraint if s["constrained"] else None
        if con is not None and hasattr(con, "begin"):
            con.begin()
        t0 = time.perf_counter()
        new, reason = core.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=s["temperature"],
                                  top_k=s["top_k"], rng=rng, eos_id=vocab.eos_id, constraint=con,
                                  backtrack=config["backtrack"] if con else 0, return_reason=True)
        stats = con.sample_stats() if con is not None and hasattr(con, "sample_stats") else None
        return vocab.decode(new), reason, time.perf_counter() - t0, stats

    t0 = time.perf_counter()
    out = core.parallel_map(draw, items, seed=seed, progress=tag)
    wall = time.perf_counter() - t0
    starts = [0]
    for s in setting_list:
        starts.append(starts[-1] + s["n"])
    return [out[a:b] for a, b in zip(starts, starts[1:])], wall


def score_samples(samples, train_canonical, to_smiles, block=None):
    """Validity (a sample that did not end with <eos> is invalid: 'no_eos'), uniqueness and novelty
    (generation_metrics.tutorial_novelty: the tutorial's definitions, and novelty_of_valid, ours), failure and stop
    reasons, and per sample: string, stop reason, token count (and the constraint's counters).  With more
    than ``block`` samples (the tutorial's 200 per setting), also the three scores per consecutive block of
    that many (``at_tutorial_n``, generation_metrics.tutorial_scores_by_block): the like-for-like ones."""
    strings = [to_smiles(x[0]) for x in samples]
    reasons = [x[1] for x in samples]
    counted = [st if r == "eos" else None for st, r in zip(strings, reasons)]
    rec = generation_metrics.tutorial_novelty(counted, train_canonical)
    canon = rec.pop("canonical")
    fails = chemdata.Counter("no_eos" if r != "eos" else smiles_grammar.smiles_failure_reason(st)
                             for st, r, c in zip(strings, reasons, canon) if not c)
    n_tokens = [len(x[0]) for x in samples]
    seconds = math.fsum(x[2] for x in samples)
    rec.update({"uniqueness_of_valid": rec["n_unique_valid"] / rec["n_valid"] if rec["n_valid"] else None,
                "failures": {r: fails.get(r, 0) for r in ("no_eos",) + smiles_grammar.FAILURE_REASONS},
                "failures_after_eos": {k: v for k, v in fails.items() if k != "no_eos"},
                "stop_reason_counts": dict(chemdata.Counter(reasons)),
                "mean_length": sum(n_tokens) / len(samples),
                "mean_length_valid": (sum(n for n, c in zip(n_tokens, canon) if c) / rec["n_valid"]
                                      if rec["n_valid"] else None),
                "decode_time_s": seconds, "tokens_per_s": (sum(n_tokens) + len(samples)) / seconds if seconds else None,
                "samples": strings, "stop_reasons": reasons, "n_tokens": n_tokens})
    if block and len(samples) > block:
        rec["at_tutorial_n"] = generation_metrics.tutorial_scores_by_block(canon, train_canonical, block)
    if samples and samples[0][3] is not None:
        rec["undos"] = [x[3]["undos"] for x in samples]
        rec["forced_closures"] = [x[3]["forced_closures"] for x in samples]
        rec.update(forced_summary([bool(x[3].get("forced")) for x in samples], canon))
        rec["closed_on_eos_share"] = sum(bool(x[3].get("closed_on_eos")) for x in samples) / len(samples)
        rec["own_eos_share"] = sum(why == "eos" and not x[3].get("closed_on_eos") and not x[3].get("forced")
                                   for x, why in zip(samples, reasons)) / len(samples)   # the model's own <eos>
        rec["shape_by_ending"] = shape_by_ending(samples, strings, canon, train_canonical)
    valid = [bool(c) for c in canon]
    rec["validity_by_length"] = generation_metrics.validity_by_length(n_tokens, valid)
    rec["shape"] = shape_record([st for st, c in zip(strings, canon) if c], train_canonical)
    return rec


ENDINGS = ("own <eos>", "closed at <eos>", "forced")   # how a constrained sample ended (shape_by_ending)


def shape_by_ending(samples, strings, canon, train_canonical):
    """{ending: shape_record of its valid samples} of a constrained setting: where its shape comes from.  Forced:
    the budget ended it (a closing may be forced too); closed at <eos>: the constraint closed it after the model
    chose <eos> in an unfinished molecule; own <eos>: the model's <eos> ended a complete molecule."""
    def ending(stats):
        return ENDINGS[2] if stats.get("forced") else ENDINGS[1] if stats.get("closed_on_eos") else ENDINGS[0]
    return {e: shape_record([st for x, st, c in zip(samples, strings, canon) if c and ending(x[3]) == e],
                            train_canonical) for e in ENDINGS}


def forced_summary(forced, canon):
    """The share of samples whose ending the token budget forced, and the validity of the others."""
    free = [c for f, c in zip(forced, canon) if not f]
    return {"forced": forced, "forced_share": sum(forced) / len(forced),
            "validity_not_forced": sum(1 for c in free if c) / len(free) if free else None}


def sampling_rows(model, vocab, config, train_canonical, seed, run, to_smiles=None, constrained_too=True,
                  tag="sample", n_headline=None, headline_only=False, *, stream):
    """Every setting sampled from ``model`` and scored: [row per setting], wall time (s)."""
    setting_list = settings(config, constrained_too, n_headline, headline_only)
    return sampling_rows_for(model, vocab, config, setting_list, train_canonical, seed, run, to_smiles, tag,
                             stream=stream)


def sampling_rows_for(model, vocab, config, setting_list, train_canonical, seed, run, to_smiles=None,
                      tag="sample", *, stream):
    """``sampling_rows`` over a given list of settings (``stream``: the model's name in the samples' keys)."""
    to_smiles = to_smiles or (lambda tokens: "".join(tokens))
    budget = config.get("constraint_budget") or config["max_new_tokens"]   # the constraint ends every molecule
    #                                                                          within this many tokens
    options = config.get("constraint_options") or {}
    constrained_too = any(s["constrained"] for s in setting_list)
    factory = ((lambda: smiles_grammar.SmilesConstraint(vocab, max_new_tokens=budget, **options))
               if constrained_too else None)
    per_setting, wall = sample_all(model, vocab, config, setting_list, seed, factory, tag, stream=stream)
    rows = []
    for s, samples in zip(setting_list, per_setting):
        rec = dict(s, **score_samples(samples, train_canonical, to_smiles, block=config["n_samples"]))
        rows.append(rec)
        run.log(f"  [{tag}] tau {s['temperature']} top-k {s['top_k']} "
                f"{'constrained' if s['constrained'] else 'free':>11} "
                f"(n {rec['n']}): validity {rec['validity']:.3f} uniqueness {rec['uniqueness']:.3f} novelty "
                f"{rec['novelty'] if rec['novelty'] is None else round(rec['novelty'], 3)} "
                f"{rec['tokens_per_s'] or 0:.0f} tokens/s failures { {k: v for k, v in rec['failures'].items() if v} }")
    return rows, wall


# ----------------------------------------------------------------------------- n-gram, distribution


def ngram_baseline(vocab, ids, config, train_canonical, seed, run, n_headline):
    """The n-gram LM (generation_metrics.fit_ngram: interpolated or modified Kneser-Ney, n in 2..20 and the discount
    chosen on valid, with whether the choice is interior to the grid), its bits/token per split
    and per test molecule, sampled at the HEADLINE settings (free and constrained) the same way, with the
    same constraint and budget, as the Transformer; n_headline samples each (config n_ngram, 1,000 by
    default: the constrained n-gram costs ~0.16 CPU-s a sample; the other settings are left out for time)."""
    t0 = time.perf_counter()
    model, grid = generation_metrics.fit_ngram(ids["train"], ids["valid"], len(vocab), vocab.bos_id)
    fit = {name: {"bits_per_token": generation_metrics.ngram_bits_per_token(model, ids[name])} for name in ids}
    fit["test_molecule_bits"] = [math.fsum(model.bits(x)) for x in ids["test"]]
    interior = generation_metrics.ngram_choice_interior(grid, model)
    run.log(f"  n-gram: {model.variant} Kneser-Ney, n {model.n}, discount {model.discount} (chosen on valid from "
            f"{len(grid)} settings; interior {interior}), test {fit['test']['bits_per_token']:.3f} bits/token "
            f"({time.perf_counter() - t0:.1f} s)")
    rows, wall = sampling_rows(model, vocab, config, train_canonical, seed, run, tag="sample n-gram",
                               n_headline=n_headline, headline_only=True, stream="n-gram")
    return {"variant": model.variant, "n": model.n, "discount": model.discount,
            "discounts": [list(d) for d in model.discounts], "interior": interior, "grid": grid, "fit": fit,
            "sampling": rows, "sampling_wall_time_s": wall}


def ngram_paired_test(results):
    """Paired bootstrap over the test molecules: Transformer (seed 0) - n-gram bits per molecule."""
    a, b = results["fit"]["test_molecule_bits"], results["ngram"]["fit"]["test_molecule_bits"]
    return evaluation.paired_bootstrap(None, a, b, metric="mean", seed=0)


def _headline(rows):
    return [r for r in rows if (r["temperature"], r["top_k"]) in HEADLINE]


def _distribution_row(name, smiles, train, size, extra=None):
    t0 = time.perf_counter()
    rec = dict(extra or {}, source=name, n=len(smiles))
    rec.update(generation_metrics.distribution_metrics(smiles, train, long_tokens=LONG_TOKENS))
    rec["kl_at_size"] = generation_metrics.kl_score_at_size(smiles, train, size, repeats=KL_REPEATS)
    rec["examples"] = [x for x in smiles if x and chemdata.canonical_smiles(x)][:24]     # for the figures' grids
    rec["wall_time_s"] = time.perf_counter() - t0
    return rec


def distribution_table(sources, splits, n_headline, seed, run):
    """GuacaMol KL / FCD scores, MOSES metrics and lengths of each headline setting of each source
    ({name: sampling rows}; samples without <eos> count as invalid), with the reference rows: the
    training split resampled (n_headline draws with replacement), the test split.  Against the training
    split.  {"available": False, "reason"} without guacamol / fcd."""
    try:
        versions = generation_metrics.distribution_package_versions()
    except ImportError as e:
        if os.environ.get("REQUIRE_CHEM", "").strip().lower() in ("1", "true", "yes"):
            raise
        return {"available": False, "reason": str(e)}
    train = splits["train"]
    resampled = [core.keyed_rng("training resample", seed, i).choice(train) for i in range(n_headline)]
    size = len({chemdata.canonical_smiles(x) for x in splits["test"]} - {None})   # every row's KL at this size too
    out = []
    for name, rows in sources.items():
        for r in _headline(rows):
            smiles = [st if why == "eos" else "" for st, why in zip(r["samples"], r["stop_reasons"])]
            out.append(_distribution_row(name, smiles, train, size,
                                         {k: r[k] for k in ("temperature", "top_k", "constrained")}))
    for name, smiles in (("training (resampled)", resampled), ("test split", splits["test"])):
        out.append(_distribution_row(name, smiles, train, size, {"reference": True}))
    g = report_kit.fmt
    for x in out:
        run.log(f"  {x['source']:>20} {x.get('temperature', '')} {x.get('top_k', '')} "
                f"{'constrained' if x.get('constrained') else ''}: KL {g(x['kl']['score'])} "
                f"(at {x['kl_at_size']['size']}: {g(x['kl_at_size']['mean'])}) FCD score "
                f"{g(x['fcd']['score'])} IntDiv1 {g(x['int_div1'])} SNN {g(x['snn'])} share >= {LONG_TOKENS} "
                f"tokens {g(x['share_long'])} ({x['wall_time_s']:.1f} s)")
    train_hist = generation_metrics.length_histogram([len(chemdata.tokenize_smiles(x)) for x in train])
    return {"available": True, "versions": versions, "reference_set": "training split", "rows": out,
            "train_length_histogram": train_hist}


def speed_test(model, vocab, config, seed):
    """Tokens/s of one process sampling the same molecules with and without the K/V cache."""
    n, out = config["n_speed"], {}
    for cached in (True, False):
        t0, seqs = time.perf_counter(), []
        for i in range(n):
            seqs.append(core.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=1.0,
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
    return {k: [chemdata.tokenize_selfies(smiles_grammar.smiles_to_selfies(s)) for s in v] for k, v in splits.items()}


def selfies_to_string(tokens):
    """A sampled SELFIES token list -> SMILES ('' if it holds <unk>, so it counts as invalid 'unk')."""
    if "<unk>" in tokens:
        return "<unk>"
    return smiles_grammar.selfies_to_smiles("".join(tokens))


def run_selfies(config, splits, train_canonical, run, workers, n_headline):
    tokens = selfies_tokens(splits)
    vocab = chemdata.Vocab.build(tokens["train"])
    ids, unk = encode_splits(tokens, vocab)
    model, hist = train_model(config, len(vocab), ids, 0, run, "selfies_seed0", workers)
    fit = fit_all(model, ids, splits, tokens, 0, run)
    rows, wall = sampling_rows(model, vocab, config, train_canonical, 0, run, to_smiles=selfies_to_string,
                               constrained_too=False, tag="sample selfies", n_headline=n_headline,
                               stream="SELFIES Transformer")
    return {"data": {"vocab_size": len(vocab), "itos": vocab.itos, "unk_counts": unk,
                     "n_tokens": {k: sum(map(len, v)) for k, v in tokens.items()}},
            "model": {"parameters": core.param_count(model)}, "history": hist, "fit": fit, "sampling": rows,
            "sampling_wall_time_s": wall}


def run_seed(seed, config, vocab, ids, splits, tokens, train_canonical, run, workers):
    model, hist = train_model(config, len(vocab), ids, seed, run, f"smiles_seed{seed}", workers)
    fit = fit_all(model, ids, splits, tokens, seed, run)
    rows, wall = sampling_rows(model, vocab, config, train_canonical, seed, run, tag=f"sample seed {seed}",
                               stream=SMILES_STREAM)
    dist = distribution_table({"Transformer": rows}, splits, config["n_headline"], seed, run)
    if dist.get("available"):
        dist["rows"] = [x for x in dist["rows"] if not x.get("reference")]   # seed 0 holds the reference rows
    for r in rows:
        for key in ("samples", "stop_reasons", "n_tokens", "undos", "forced_closures", "forced"):
            r.pop(key, None)                                     # the seed-0 samples are the stored ones
    return {"history": {"epochs": hist["epochs"], "n_steps": hist["n_steps"], "wall_time_s": hist["wall_time_s"]},
            "fit": fit, "sampling": rows, "sampling_wall_time_s": wall, "distribution": dist}


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
    core.save_model(model, path, meta={"vocab": vocab.itos, "tokenizer": "chemdata.tokenize_smiles",
                                     "split": "chemdata.scaffold_split(ESOL)", "seed": seed,
                                     "test_bits_per_token": fit["test"]["bits_per_token"],
                                     "git_commit": run.git_commit, "mode": run.mode})
    return path, core.load_model(path)


def run_extended(config, splits, vocab, ids, tokens, train_canonical, run, workers, n_stages, n_headline):
    """Stages 8-9 of --extended: the SELFIES model (its headline settings n_headline times, with their
    distribution metrics), then the extra seeds (config's n_headline, with theirs)."""
    run.stage(8, n_stages, "extended: SELFIES model (same size, same split)")
    def selfies_with_distribution():
        selfies = run_selfies(config, splits, train_canonical, run, workers, n_headline)
        selfies["distribution"] = distribution_table({"SELFIES Transformer": selfies["sampling"]}, splits,
                                                     n_headline, 0, run)
        return selfies
    extended = {"selfies": run.resumable("selfies", selfies_with_distribution)}
    run.stage(9, n_stages, f"extended: seeds {list(config['extended_seeds'])}")
    extended["seeds"] = {str(s): run.resumable(f"seed{s}", functools.partial(
        run_seed, s, config, vocab, ids, splits, tokens, train_canonical, run, workers))
                         for s in config["extended_seeds"]}
    return extended


def ladder_stage(results, state, config, run, workers):
    """Stage 10 of --extended: the recipe ladder (demos/smiles_lm_ladder.py), each rung paired against the
    tuned n-gram, and the best rung's seed-0 model sampled at tau 1.0 (free and constrained, as many samples
    as the tutorial recipe's headline rows) beside the tutorial recipe's row."""
    splits, tokens, vocab, ids, train_canonical = state
    ctx = {"config": config, "vocab": vocab, "ids": ids, "smiles": splits, "make_model": make_model}
    ladder = smiles_lm_ladder.run_ladder(ctx, workers, run, common.QUICK)
    ng = results["ngram"]
    ladder["rungs"] = smiles_lm_ladder.rung_table(ladder, ng["fit"]["test_molecule_bits"],
                                                  ng["fit"]["test"]["bits_per_token"])
    ladder["first_better"] = smiles_lm_ladder.first_better(ladder["rungs"])
    ladder["best_rung"] = best = smiles_lm_ladder.best_rung(ladder["rungs"])
    ladder["tutorial_rung_check"] = smiles_lm_ladder.tutorial_rung_check(ladder, results["fit"])
    for r in ladder["rungs"]:
        run.log(f"  ladder {r['rung']:>15}: test {r['test_bits_per_token']['mean']:.3f} bits/token "
                f"({r['test_bits_per_token']['min']:.3f}-{r['test_bits_per_token']['max']:.3f}), vs n-gram "
                f"{r['paired_bootstrap']['diff']:+.2f} [{r['paired_bootstrap']['ci_low']:+.2f}, "
                f"{r['paired_bootstrap']['ci_high']:+.2f}] bits/molecule: {r['verdict']}")
    rec = next(r for r in ladder["runs"] if r["rung"] == best and r["seed"] == ladder["seeds"][0])
    n = results["sampling_sizes"]["headline"]
    ladder["best_sampling"] = run.resumable(f"ladder_sampling_{best}", lambda: sample_rung(
        rec, config, vocab, splits, train_canonical, n, run))
    for r in ladder["runs"]:
        r.pop("weights", None)
    return ladder


def sample_rung(rec, config, vocab, splits, train_canonical, n, run):
    """A ladder rung's seed-0 model (its restored epoch) sampled at tau 1.0, free and constrained, n each,
    scored as the tutorial recipe's rows, with its distribution metrics (KL at the test split's size, FCD)."""
    model = make_model(config, len(vocab), rec["seed"], dropout=rec["dropout"])
    for name, p in model.named_params().items():
        p.data = rec["weights"][name]
    setting_list = [dict(temperature=1.0, top_k=None, constrained=c, n=n) for c in (False, True)]
    rows, wall = sampling_rows_for(model, vocab, config, setting_list, train_canonical, rec["seed"], run,
                                   tag=f"sample ladder {rec['rung']}", stream=f"ladder: {rec['rung']}")
    dist = distribution_table({"ladder: " + rec["rung"]: rows}, splits, n, rec["seed"], run)
    if dist.get("available"):
        dist["rows"] = [x for x in dist["rows"] if not x.get("reference")]
    for r in rows:
        for key in ("samples", "stop_reasons", "n_tokens", "undos", "forced_closures", "forced"):
            r.pop(key, None)
    return {"rung": rec["rung"], "seed": rec["seed"], "epoch": rec["chosen"]["epoch"], "sampling": rows,
            "sampling_wall_time_s": wall, "distribution": dist}


PROBES = (("earlier runs' constraint: budget 60, masked <eos> sampled around", {"constraint_budget": 60}, {}),
          ("budget never below the longest training molecule", {}, {}),
          ("+ closing when the model chooses <eos> (the headline setting)", {}, {"close_on_eos": True}),
          ("+ rings no larger than the training molecules' largest", {},
           {"close_on_eos": True, "max_ring_size": "training"}),
          ("+ looking ahead: only tokens after which a search finds a completion", {},
           {"close_on_eos": True, "max_ring_size": "training", "lookahead": True}))
CANDIDATE_OPTIONS = dict(PROBES[-1][2])  # the constraint that becomes the headline once it meets the targets
ADDED_CANDIDATE = "the candidate constraint's rows (--add-candidate: the saved seed-0 model, nothing trained)"


def candidate_constraint(model, vocab, config, splits, train_canonical, run, n_headline, headline_rows):
    """Stage 11 of --extended (or --add-candidate): every constrained setting again under CANDIDATE_OPTIONS, the
    same model, sizes and random streams as the headline rows (``setting_stream``): the before -> after of the
    constraint, draw for draw; the headline settings' distribution rows too, and their shapes paired by stream
    against ``headline_rows`` (seed 0's sampling rows, with their per-sample lists: ``paired_shape``)."""
    cfg = dict(config, constraint_options=constraint_options_for(CANDIDATE_OPTIONS, train_canonical))
    setting_list = [s for s in settings(config, n_headline=n_headline) if s["constrained"]]
    rows, wall = sampling_rows_for(model, vocab, cfg, setting_list, train_canonical, 0, run, tag="candidate constraint",
                                   stream=SMILES_STREAM)
    dist = distribution_table({"Transformer, candidate constraint": rows}, splits, n_headline, 0, run)
    if dist.get("available"):
        dist["rows"] = [x for x in dist["rows"] if not x.get("reference")]
    before = {(x["temperature"], x["top_k"], x["n"]): x for x in headline_rows if x["constrained"] and "samples" in x}
    for r in rows:
        if (r["temperature"], r["top_k"]) in HEADLINE and (head := before.get((r["temperature"], r["top_k"], r["n"]))):
            r["paired_shape"] = paired_shape(head, r, train_canonical)
    for r in rows:
        for key in ("samples", "stop_reasons", "n_tokens", "undos", "forced_closures", "forced"):
            r.pop(key, None)
    return {"options": cfg["constraint_options"], "rows": rows, "distribution": dist, "wall_time_s": wall}


PAIRED_RESAMPLES = 1000     # paired_shape: bootstrap resamples of the streams


def paired_shape(head, cand, train_canonical):
    """Candidate - headline KS against training (heavy atoms, ring count) of one setting's valid samples, forced
    included (as the shape columns), paired by random stream (sample i of both draws from one stream):
    ``evaluation.paired_bootstrap_statistic`` over the streams, PAIRED_RESAMPLES draws."""
    ref = train_canonical.shape

    def shapes(row):
        return [generation_metrics.molecule_shape(st) if why == "eos" else None
                for st, why in zip(row["samples"], row["stop_reasons"])]
    a, b = shapes(cand), shapes(head)

    def test(key):
        return evaluation.paired_bootstrap_statistic(
            [x and x[key] for x in a], [x and x[key] for x in b],
            lambda xs: generation_metrics.ks_statistic(xs, ref[key]), PAIRED_RESAMPLES)
    return {"ks_heavy_atoms": test("heavy_atoms"), "ks_rings": test("rings")}


ADDED_PROBE = "the probe rows missing from the file (--add-probe: the saved seed-0 model, nothing trained)"


def probe_constraints(model, vocab, config, train_canonical, run, n, skip=()):
    """Stage 11 of --extended: the seed-0 model at tau 1.0 (all tokens), n samples under each constraint of
    PROBES, one change at a time, scored as the headline rows (validity, forced endings, shapes, validity by
    length) without the per-sample lists: what each part of the constraint does to the samples' shape.
    ``skip``: labels already sampled (``--add-probe``)."""
    rows = []
    for label, over, options in PROBES:
        if label in skip:
            continue
        options = constraint_options_for(options, train_canonical)
        cfg = dict(config, constraint_options=options, **over)
        cfg["constraint_budget"] = min(cfg["constraint_budget"], config["max_new_tokens"])
        [row], wall = sampling_rows_for(model, vocab, cfg, [dict(temperature=1.0, top_k=None, constrained=True, n=n)],
                                        train_canonical, 0, run, tag=f"probe: {label}", stream=SMILES_STREAM)
        for key in ("samples", "stop_reasons", "n_tokens", "undos", "forced_closures", "forced"):
            row.pop(key, None)
        rows.append(dict(row, label=label, budget=cfg["constraint_budget"], options=options, wall_time_s=wall))
    return rows


def saved_model(payload, run):
    """(model, vocab, config, splits) of an --extended results file's saved seed-0 model (``models/smiles_lm.json``,
    checked to be the file's own: its test bits/token must be the ones the file's fit gives)."""
    r, cfg = payload["results"], dict(payload["config"], constraint_budget=payload["results"]["sampling_sizes"]
                                      ["constraint_budget"])
    path, vocab = model_path(run), chemdata.Vocab(r["data"]["itos"][len(chemdata.Vocab.SPECIALS):])
    model, splits = core.load_model(path), load_split(cfg)
    ids, _ = encode_splits({"test": [chemdata.tokenize_smiles(x) for x in splits["test"]]}, vocab)
    bits = evaluate(model, ids["test"], splits["test"], payload["seed"])[0]["bits_per_token"]
    if abs(bits - r["fit"]["test"]["bits_per_token"]) > 1e-9:
        raise ValueError(f"{path} gives test bits/token {bits!r}, the file {run.path} says "
                         f"{r['fit']['test']['bits_per_token']!r}: not the file's model")
    return model, vocab, cfg, splits


def add_probe(run, config):
    """--add-probe: the PROBES rows an existing results file lacks, sampled from its saved seed-0 model
    (``saved_model``) with the file's configuration, appended to its constraint_probe; recorded under
    ``updates``."""
    def update(payload):
        r = payload["results"]
        done = {x["label"] for x in r.get("constraint_probe") or []}
        if not r.get("constraint_probe") or done >= {label for label, _, _ in PROBES}:
            raise ValueError(f"--add-probe: {run.path} has no probe table (an --extended run writes it) or "
                             f"already has every probe row ({len(done)})")
        model, vocab, cfg, splits = saved_model(payload, run)
        r["constraint_probe"] += probe_constraints(model, vocab, cfg, TrainingSet.of(splits["train"]), run,
                                                   cfg["n_probe"], done)
        r["reading"] = report_smiles_lm.reading_text(r)             # the stored reading follows the new rows
    common.update_results(run.path, ADDED_PROBE, update)


def add_candidate(run, config):
    """--add-candidate: the candidate constraint's rows (``candidate_constraint``) sampled into an existing
    --extended results file from its saved seed-0 model, at the file's sizes; recorded under ``updates``."""
    def update(payload):
        r = payload["results"]
        if not r.get("constraint_probe"):
            raise ValueError(f"--add-candidate: {run.path} is not an --extended run's results (no probe table)")
        model, vocab, cfg, splits = saved_model(payload, run)
        r["constraint_candidate"] = candidate_constraint(model, vocab, cfg, splits, TrainingSet.of(splits["train"]),
                                                         run, r["sampling_sizes"]["headline"], r["sampling"])
        r["reading"] = report_smiles_lm.reading_text(r)             # the stored reading follows the new rows
    common.update_results(run.path, ADDED_CANDIDATE, update)


def checks(model, reloaded, vocab, config, rows, speed, n_params):
    """The booleans of the smoke tests: reference size, save/load, cache, grammar, every sample stored."""
    probe = [vocab.bos_id, vocab.stoi.get("C", 4)]
    con_rows = [r for r in rows if r["constrained"]]
    return {
        "parameter_count_is_reference": n_params == 39360 if len(vocab) == 28 else True,
        "reloaded_model_samples_identically": core.generate(model, probe, 20, rng=7)
                                              == core.generate(reloaded, probe, 20, rng=7),
        "cached_equals_uncached": speed["identical"],
        "constrained_never_unbalanced": all(not set(r["failures_after_eos"]) & set(GRAMMAR) for r in con_rows),
        "every_sample_stored": all(len(r["samples"]) == len(r["stop_reasons"]) == len(r["n_tokens"]) == r["n"]
                                   for r in rows),
        "no_eos_never_valid": all(r["n_valid"] <= r["stop_reason_counts"].get("eos", 0) for r in rows),
    }


def constraint_options_for(options, train_canonical):
    """The constraint's options with ``max_ring_size="training"`` replaced by the training split's largest
    ring (in atoms), the number recorded in the results' config."""
    options = dict(options or {})
    if options.get("max_ring_size") == "training":
        options["max_ring_size"] = train_canonical.shape["max_ring"]
    return options


def constraint_budget(config, train_tokens):
    """The constraint's token budget: SmilesConstraint.length_budget of the training molecules (never below the
    longest of them, <eos> included: a molecule is steered shut only past the lengths it was trained on), capped
    at generate's max_new_tokens (100, above ESOL's longest, 98)."""
    tie = getattr(smiles_grammar.SmilesConstraint, "length_budget", None)
    return min(config["max_new_tokens"], tie(train_tokens)) if tie else config["max_new_tokens"]


def train_and_sample(args, config, run, n_stages, n_headline):
    """Stages 1-5: data, training, fit, sampling, speed.  Returns (results so far, state for the rest)."""
    run.stage(1, n_stages, "data: ESOL scaffold split, atom tokens, 28-id vocabulary")
    splits, tokens, vocab, ids, data = prepare_data(config, run)
    train_canonical = TrainingSet.of(splits["train"])
    config["constraint_budget"] = constraint_budget(config, tokens["train"])
    config["constraint_options"] = constraint_options_for(config.get("constraint_options"), train_canonical)
    max_ring = train_canonical.shape["max_ring"]
    data["train_shape"] = dict(generation_metrics.shape_summary(splits["train"], train_max_ring=max_ring),
                               max_ring=max_ring)
    run.log(f"  constraint budget {config['constraint_budget']} tokens (generate's cap {config['max_new_tokens']}; "
            f"longest training molecule {max(map(len, tokens['train'])) + 1} with <eos>), largest ring "
            f"{train_canonical.shape['max_ring']} atoms")

    run.stage(2, n_stages, f"training the LM ({config['epochs']} epochs, batch {config['batch_size']})")
    model, hist = train_model(config, len(vocab), ids, args.seed, run, f"smiles_seed{args.seed}", args.workers)
    n_params = core.param_count(model)
    run.log(f"  {n_params:,} parameters (reference 39,360), {hist['n_steps']} steps, "
            f"{common.fmt_time(hist['wall_time_s'])}")

    run.stage(3, n_stages, "fit: bits/token, perplexity, accuracy per split")
    fit = fit_all(model, ids, splits, tokens, args.seed, run)
    path, reloaded = save_and_reload(model, vocab, fit, args.seed, run)

    run.stage(4, n_stages, f"sampling: 16 settings x {config['n_samples']} molecules, the headline ones x "
                           f"{n_headline} (K/V cache, parallel_map)")
    rows, wall = run.resumable(f"sampling_seed{args.seed}", lambda: sampling_rows(
        model, vocab, config, train_canonical, args.seed, run, n_headline=n_headline, stream=SMILES_STREAM))

    run.stage(5, n_stages, "speed: cached vs uncached sampling, one process")
    speed = speed_test(model, vocab, config, args.seed)
    speed["sampling_wall_time_s"] = wall
    run.log(f"  cached {speed['cached']['tokens_per_s']:.0f} tokens/s, uncached "
            f"{speed['uncached']['tokens_per_s']:.0f} tokens/s ({speed['speedup']:.1f}x)")
    results = {"data": data, "model": {"parameters": n_params, "reference_parameters": 39360,
                                       "config": model.config, "batch_size": config["batch_size"],
                                       "n_steps": hist["n_steps"], "train_wall_time_s": hist["wall_time_s"],
                                       "path": os.path.relpath(path, common.ROOT)},
               "history": hist, "fit": fit, "sampling": rows, "speed": speed,
               "sampling_sizes": {"headline": n_headline, "other": config["n_samples"],
                                  "constraint_budget": config["constraint_budget"],
                                  "headline_settings": [list(h) for h in HEADLINE],
                                  "streams": "per setting"}}    # setting_stream: the page says which rule ran
    results["checks"] = checks(model, reloaded, vocab, config, rows, speed, n_params)
    return results, (splits, tokens, vocab, ids, train_canonical)


def extra_args(p):
    p.add_argument("--add-probe", action="store_true",
                   help="sample the probe rows (PROBES) an existing --extended results file lacks, from the saved "
                        "seed-0 model (nothing trained); recorded under 'updates'")
    p.add_argument("--add-candidate", action="store_true",
                   help="sample every constrained setting under the candidate constraint (CANDIDATE_OPTIONS) into an "
                        "existing --extended results file, from the saved seed-0 model; recorded under 'updates'")


def main():
    args, config, run = common.start("smiles_lm", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    if args.add_probe and args.add_candidate:
        raise SystemExit("demo_smiles_lm: --add-probe and --add-candidate are separate updates: one at a time")
    if args.add_probe or args.add_candidate:
        (add_probe if args.add_probe else add_candidate)(run, config)
        return run.log(f"updated {run.path}")
    n_stages = 8 + (4 if run.extended else 0)
    n_headline = EXTENDED_HEADLINE if run.extended and not common.QUICK else config["n_headline"]
    results, (splits, tokens, vocab, ids, train_canonical) = train_and_sample(args, config, run, n_stages, n_headline)

    run.stage(6, n_stages, "n-gram baseline: n and discount chosen on valid, sampled the same way")
    n_ngram = EXTENDED_NGRAM if run.extended and not common.QUICK else config["n_ngram"]   # for time: see the docstring
    results["ngram"] = run.resumable("ngram", lambda: ngram_baseline(vocab, ids, config, train_canonical, args.seed,
                                                                     run, n_ngram))
    results["sampling_sizes"]["ngram"] = n_ngram
    results["ngram"]["paired_bootstrap"] = ngram_paired_test(results)

    run.stage(7, n_stages, "distribution metrics against the training split (GuacaMol, MOSES, lengths)")
    results["distribution"] = run.resumable(f"distribution_seed{args.seed}", lambda: distribution_table(
        {"Transformer": results["sampling"], "n-gram": results["ngram"]["sampling"]}, splits, n_headline, args.seed,
        run))
    if run.extended:
        results["extended"] = run_extended(config, splits, vocab, ids, tokens, train_canonical, run, args.workers,
                                           n_stages, n_headline)
        run.stage(10, n_stages, "extended: the recipe ladder against the tuned n-gram (torch_bridge, 3 seeds a rung)")
        results["ladder"] = ladder_stage(results, (splits, tokens, vocab, ids, train_canonical), config, run,
                                         args.workers)
        run.stage(11, n_stages, f"extended: the constraint's parts, one at a time ({config['n_probe']} samples each), "
                                  "and every constrained setting under the candidate constraint")
        results["constraint_probe"] = run.resumable("constraint_probe", lambda: probe_constraints(
            core.load_model(model_path(run)), vocab, config, train_canonical, run, config["n_probe"]))
        results["constraint_candidate"] = run.resumable("constraint_candidate", lambda: candidate_constraint(
            core.load_model(model_path(run)), vocab, config, splits, train_canonical, run, n_headline,
            results["sampling"]))

    run.stage(n_stages, n_stages, "checks and reading")
    results["reading"] = report_smiles_lm.reading_text(results)   # the page's reading, as one paragraph
    run.log(results["reading"])
    run.finish(results)


if __name__ == "__main__":
    main()
