"""Supplementary - tokenization: how many tokens does a SMILES cost under char-level, atom-level and
BPE tokenization, and is every scheme lossless?

Data: all 1128 ESOL SMILES (chemdata.load_esol).  The 902 "training" molecules are the train indices
of chemdata.scaffold_split(esol.smiles) (the 902/113/113 scaffold split used by the other demos).
Vocabularies and BPE merges are learned on those 902 SMILES only; token counts are measured on all
1128.  Tokenizers: chemdata.tokenize_chars (one token per character), chemdata.tokenize_smiles
(atom-level regex: bracket atoms, Cl, Br, %nn are single tokens) and bpe.BPE trained on the
characters of the 902 SMILES with min_pair_freq = 2 (merges requested: 32 ... 1024, plus 512 with the
end-of-word marker).  No number in the results file is typed in: everything is measured here.

What is measured (sections of ``results`` in figures/results_tokenization.json):

``split`` - {n_molecules, n_train, n_valid, n_test, method}.

``schemes`` - list of records, one per tokenization (plot mean_tokens / sum_T2_rel_char vs
    merges_done).  Fields:
      scheme, kind ("char" | "atom" | "bpe"), merges_requested, merges_done, end_of_word
      vocab              char/atom: distinct symbols in the 902 training SMILES (no specials);
                         bpe: len(bpe.vocab) = initial symbols + merges done (``</w>`` included
                         as an initial symbol when end_of_word)
      mean_tokens        mean tokens per molecule over all 1128
      p95                95th percentile of tokens per molecule, nearest-rank definition (see
                         ``p95_definition``): the ceil(0.95 n)-th smallest value
      max, min, total    over all 1128 molecules
      sum_T2             sum over molecules of (tokens per molecule)^2 - the attention cost
      sum_T2_rel_char    sum_T2 / sum_T2 of the char scheme (1.0 for char)
      total_rel_char     total / total of the char scheme
      decodable_fraction fraction of the 1128 SMILES with decode(encode(s)) == s exactly
                         (char/atom: "".join(tokens); bpe: BPE.decode, which turns </w> back
                         into a space and strips the trailing one)
      mean_tokens_by_split  {train, valid, test}
      distinct_tokens_used_all / _train  distinct tokens that actually occur in the segmentations
                         of all 1128 / the 902 training SMILES (for BPE smaller than ``vocab``:
                         intermediate merge products such as "(=" can be absorbed by later ones, "(=O)")
      unknown_symbols_heldout  number of symbol occurrences in the 226 valid/test SMILES that are
                         not in the training vocabulary (char/atom: tokens; bpe: initial symbols,
                         bpe.unknown_symbols); ``unknown_symbol_list`` lists them with counts
    BPE records also carry:
      initial_symbols, stopped_early, skipped_pairs, vocab_ledger_exact
                         (vocab == initial_symbols + merges_done)
      n_initial_tokens, n_final_tokens, sum_gains, gain_ledger_exact
                         (training-set token counts before/after training: n_initial_tokens -
                         n_final_tokens == sum of merge_log gains)
      train_tokens_encoded   sum of len(encode(s)) over the 902 training SMILES (equals
                         n_final_tokens when encode reproduces training)
      rank_greedy_mismatches_train / _all   molecules where encode(s) differs from replaying the
                         merge_log in order (``BPE.replay``), on the 902 training / all 1128
      cuts_inside_atoms  token boundaries (over all 1128 segmentations) that fall inside an
                         atom-level token, e.g. "C / l)" cutting "Cl)" or "CC / l" cutting "CCl":
                         character BPE knows nothing about atoms; ``cuts_inside_atoms_per_token`` =
                         cuts_inside_atoms / total; ``molecules_with_cut_atoms`` counts molecules
      vocab_not_atom_aligned  learned subwords that, as strings, are not a whole number of
                         atom-level tokens (e.g. "l)"); a string-aligned subword such as "CC" can
                         still cut an atom in context, which cuts_inside_atoms counts
      standalone_end_of_word_tokens  occurrences of a bare "</w>" token (end_of_word only; the
                         marker counts as a symbol and is usually glued to the last token)

``examples`` - {name: {smiles, in_esol, in_train, char, atom, bpe512, bpe512_eow, n_char, n_atom,
    n_bpe512, n_bpe512_eow}}: segmentations of aspirin, caffeine, ClC(Br)C and [nH]1cccc1.

``top_subwords`` - the ``top_k`` merges of the BPE@1024 model (``top_subwords_model``) with the
    largest measured gain (tokens saved on the training set when the merge was made): {rank (merge
    order, 0 = first), left, right, merged, gain, atom_aligned}; sorted by gain, ties by rank.
``merge_gains_nonincreasing`` - whether merge_log gains never increase along the merge order.

``training_stop`` - for num_merges = 1024: {num_merges_requested, n_merges_done, stopped_early,
    min_pair_freq, last_gain, n_merges_with_gain_2}.  Training stops by itself when the best
    remaining pair would save fewer than min_pair_freq tokens.

``gain_ledger`` - the BPE@1024 training-set ledger: {n_initial_tokens, n_final_tokens, difference,
    sum_gains, exact}.

``char_vocabulary``, ``atom_vocabulary`` - training-set token lists with counts (descending count).

``checks`` - booleans for the smoke tests: split is 902/113/113, every scheme decodes 100%,
    ``bpe_vocab_ledger_exact`` (every BPE scheme: vocab == initial_symbols + merges_done),
    ``bpe_gain_ledger_exact`` (every BPE scheme: n_initial - n_final == sum of gains and the
    encoded training set has n_final tokens), ``rank_greedy_reproduces_training`` (0 mismatches for
    every BPE scheme; ``..._replay_all``: on all 1128), ``bpe_tokens_decrease_with_merges``,
    ``no_whitespace_in_smiles`` (needed for the end-of-word scheme to treat a SMILES as one word).

How to read it: sum_T2_rel_char is the relative cost of self-attention (T^2 per molecule) under each
tokenizer.  Atom-level differs from characters only at Cl, Br and bracket atoms, so it saves little;
BPE saves an order of magnitude, but a few of its subwords cut atoms apart (cuts_inside_atoms), its
vocabulary grows with every merge, and held-out (valid/test: other scaffolds) molecules compress
less than training ones (compare each scheme's mean_tokens_by_split with the char record's).

Usage: python demos/demo_tokenization.py; QUICK=1 runs the same configuration (it takes seconds)
and writes to figures/quick/.
"""
import math
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import bpe as bpe_mod
import chemdata

FULL = {
    "dataset": "ESOL (chemdata.load_esol), all molecules",
    "split": "chemdata.scaffold_split(smiles, (0.8, 0.1, 0.1)); train indices = BPE/vocabulary corpus",
    "fractions": [0.8, 0.1, 0.1],
    "min_pair_freq": 2,
    "bpe_merges": [32, 64, 128, 256, 512, 1024],
    # merge rules: "gain" (ours: measured tokens saved, skips pairs that recreate a symbol) and
    # "count" (the tutorial's appendix E: raw pair count); every BPE row is measured under both
    "bpe_criteria": ["gain", "count"],
    "bpe_eow_merges": [512],
    "example_merges": 512,
    "top_subwords_model_merges": 1024,
    "top_k": 20,
    "examples": {
        "aspirin": "CC(=O)Oc1ccccc1C(=O)O",
        "caffeine": "Cn1cnc2c1c(=O)n(C)c(=O)n2C",
        "caffeine_kekule": "CN1C=NC2=C1C(=O)N(C(=O)N2C)C",   # Kekulé form (PubChem), the tutorial's notation
        "chlorobromoethane": "ClC(Br)C",
        "pyrrole": "[nH]1cccc1",
    },
}
QUICK_OVERRIDES = {}   # the full run takes seconds; QUICK measures exactly the same things

P95_DEFINITION = ("nearest rank: sort the per-molecule token counts ascending and take the "
                  "ceil(0.95 * n)-th value (1-based)")


# ---------------------------------------------------------------------------- measurements
def nearest_rank(values, q):
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s))) - 1]


def length_stats(lengths):
    return {"mean_tokens": sum(lengths) / len(lengths), "p95": nearest_rank(lengths, 0.95),
            "max": max(lengths), "min": min(lengths), "total": sum(lengths),
            "sum_T2": sum(t * t for t in lengths)}


def boundaries(tokens):
    """Character offsets at which tokens end (the cut points of a segmentation)."""
    cuts, pos = set(), 0
    for t in tokens:
        pos += len(t)
        cuts.add(pos)
    return cuts


def atom_aligned(piece):
    """True if the string is a whole number of atom-level tokens (tokenize_smiles accepts it)."""
    piece = piece.replace(bpe_mod.END_OF_WORD, "")
    if not piece:
        return True
    try:
        chemdata.tokenize_smiles(piece)
        return True
    except ValueError:
        return False


def fixed_scheme(name, tokenize, smiles, split_of, train_idx):
    """char / atom: vocabulary = distinct training tokens."""
    toks = [tokenize(s) for s in smiles]
    train_counts = Counter(t for i in train_idx for t in toks[i])
    unknown = Counter(t for i, ts in enumerate(toks) if split_of[i] != "train"
                      for t in ts if t not in train_counts)
    lengths = [len(t) for t in toks]
    rec = {"scheme": name, "kind": name, "merges_requested": 0, "merges_done": 0,
           "end_of_word": False, "vocab": len(train_counts)}
    rec.update(length_stats(lengths))
    rec["decodable_fraction"] = sum("".join(t) == s for t, s in zip(toks, smiles)) / len(smiles)
    rec["mean_tokens_by_split"] = by_split(lengths, split_of)
    rec.update(distinct_used(toks, train_idx))
    rec["unknown_symbols_heldout"] = sum(unknown.values())
    rec["unknown_symbol_list"] = sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))
    vocab_list = sorted(train_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return rec, toks, vocab_list


def by_split(lengths, split_of):
    out = {}
    for part in ("train", "valid", "test"):
        ls = [n for n, p in zip(lengths, split_of) if p == part]
        out[part] = sum(ls) / len(ls)
    return out


def distinct_used(toks, train_idx):
    return {"distinct_tokens_used_all": len({t for ts in toks for t in ts}),
            "distinct_tokens_used_train": len({t for i in train_idx for t in toks[i]})}


def cuts_inside_atoms(toks, atom_toks):
    """(token boundaries that fall inside an atom-level token, molecules with at least one)."""
    cuts_inside, mols_cut = 0, 0
    for t, a in zip(toks, atom_toks):
        atom_cuts = boundaries(a)
        bad = sum(1 for c in boundaries([x.replace(bpe_mod.END_OF_WORD, "") for x in t])
                  if c not in atom_cuts)
        cuts_inside += bad
        mols_cut += bad > 0
    return cuts_inside, mols_cut


def bpe_scheme(merges, eow, smiles, split_of, train_idx, min_pair_freq, atom_toks, criterion="gain"):
    train = [smiles[i] for i in train_idx]
    model = bpe_mod.BPE().train(train, num_merges=merges, min_pair_freq=min_pair_freq,
                                end_of_word=eow, criterion=criterion)
    name = f"BPE@{merges}" + (" + end-of-word" if eow else "") + (" (count)" if criterion == "count" else "")
    model.unknown_symbols = 0
    toks = [model.encode(s) for s in smiles]
    heldout_unknown = Counter(c for s, p in zip(smiles, split_of) if p != "train"
                              for c in s if c not in model.token_to_id)
    lengths = [len(t) for t in toks]
    sum_gains = sum(g for _, _, g in model.merge_log)
    train_encoded = sum(lengths[i] for i in train_idx)

    mismatch = [i for i, s in enumerate(smiles) if model.replay(s) != toks[i]]
    train_set = set(train_idx)

    cuts_inside, mols_cut = cuts_inside_atoms(toks, atom_toks)

    rec = {"scheme": name, "kind": "bpe", "criterion": criterion, "merges_requested": merges,
           "merges_done": model.n_merges_done, "end_of_word": eow, "vocab": len(model.vocab),
           "initial_symbols": len(model.initial_symbols), "stopped_early": model.stopped_early,
           "skipped_pairs": len(model.skipped_pairs)}
    rec.update(length_stats(lengths))
    rec["decodable_fraction"] = sum(model.decode(t) == s for t, s in zip(toks, smiles)) / len(smiles)
    rec["mean_tokens_by_split"] = by_split(lengths, split_of)
    rec.update(distinct_used(toks, train_idx))
    rec["unknown_symbols_heldout"] = model.unknown_symbols
    rec["unknown_symbol_list"] = sorted(heldout_unknown.items(), key=lambda kv: (-kv[1], kv[0]))
    rec.update({
        "vocab_ledger_exact": len(model.vocab) == len(model.initial_symbols) + model.n_merges_done,
        "merges_recreating_a_symbol": len(model.initial_symbols) + model.n_merges_done - len(model.vocab),
        # the ledger against an independent count: characters of the training SMILES (plus one
        # </w> per word with end-of-word), and the tokens encode() actually produces on them
        "n_initial_tokens_independent": sum(len(s) for s in train) + (len(train) if eow else 0),
        "n_initial_tokens": model.n_initial_tokens, "n_final_tokens": model.n_final_tokens,
        "sum_gains": sum_gains,
        "gain_ledger_exact": model.n_initial_tokens - model.n_final_tokens == sum_gains,
        "train_tokens_encoded": train_encoded,
        "rank_greedy_mismatches_train": sum(1 for i in mismatch if i in train_set),
        "rank_greedy_mismatches_all": len(mismatch),
        "cuts_inside_atoms": cuts_inside,
        "cuts_inside_atoms_per_token": cuts_inside / sum(lengths),
        "molecules_with_cut_atoms": mols_cut,
        "standalone_end_of_word_tokens": sum(t.count(bpe_mod.END_OF_WORD) for t in toks),
        "vocab_not_atom_aligned": sum(not atom_aligned(m) for _, m, _ in model.merge_log),
    })
    return rec, model


# ---------------------------------------------------------------------------- main: the steps
def load_split(config):
    """ESOL SMILES, the scaffold split's indices and each molecule's part ("train"/"valid"/"test")."""
    smiles = chemdata.load_esol().smiles
    train_idx, valid_idx, test_idx = chemdata.scaffold_split(smiles, tuple(config["fractions"]))
    split_of = ["train"] * len(smiles)
    for i in valid_idx:
        split_of[i] = "valid"
    for i in test_idx:
        split_of[i] = "test"
    return smiles, (train_idx, valid_idx, test_idx), split_of


def all_bpe_schemes(config, smiles, split_of, train_idx, atom_toks):
    """Every BPE row of the plan (merges x criteria, plus end-of-word): (records, models); a model's
    key is (merges, eow) under the gain rule, (merges, eow, "count") under the count rule."""
    records, models = [], {}
    plan = [(m, False, c) for c in config["bpe_criteria"] for m in config["bpe_merges"]]
    plan += [(m, True, c) for c in config["bpe_criteria"] for m in config["bpe_eow_merges"]]
    for merges, eow, crit in plan:
        rec, model = bpe_scheme(merges, eow, smiles, split_of, train_idx, config["min_pair_freq"],
                                atom_toks, criterion=crit)
        records.append(rec)
        models[(merges, eow) if crit == "gain" else (merges, eow, crit)] = model
    return records, models


def log_schemes(run, schemes):
    run.log(f"  {'scheme':24s} {'merges':>6s} {'vocab':>5s} {'mean':>6s} {'P95':>4s} {'max':>4s} "
            f"{'total':>6s} {'T^2/char':>8s} {'decode':>6s}")
    for r in schemes:
        done = f"{r['merges_done']}" + ("*" if r.get("stopped_early") else "")
        run.log(f"  {r['scheme']:24s} {done:>6s} {r['vocab']:5d} {r['mean_tokens']:6.2f} {r['p95']:4d} "
                f"{r['max']:4d} {r['total']:6d} {r['sum_T2_rel_char']:8.3f} "
                f"{100 * r['decodable_fraction']:5.1f}%")
    run.log("  (* = training stopped by itself: best remaining gain < min_pair_freq)")


def examples(run, config, models, smiles, train_idx):
    """{name: segmentations of the example molecule under char, atom and BPE@example_merges}."""
    k = config["example_merges"]
    ex_model, ex_eow = models[(k, False)], models.get((k, True))
    smiles_set, train_set = set(smiles), {smiles[i] for i in train_idx}
    out = {}
    for name, s in config["examples"].items():
        e = {"smiles": s, "in_esol": s in smiles_set, "in_train": s in train_set,
             "char": chemdata.tokenize_chars(s), "atom": chemdata.tokenize_smiles(s),
             f"bpe{k}": ex_model.encode(s)}
        if ex_eow is not None:
            e[f"bpe{k}_eow"] = ex_eow.encode(s)
        for key in [key for key in e if isinstance(e[key], list)]:
            e[f"n_{key}"] = len(e[key])
        out[name] = e
        run.log(f"  {name:18s} atom {len(e['atom']):2d} | BPE@{k}: " + " / ".join(e[f"bpe{k}"]))
    return out


def top_subwords(run, config, top_model, count_model):
    """The top_k merges by measured gain (and, if trained, by raw count under the count rule)."""
    ranked = sorted(enumerate(top_model.merge_log), key=lambda rm: (-rm[1][2], rm[0]))
    out = {"top_subwords_model": f"BPE@{config['top_subwords_model_merges']}"}
    out["top_subwords"] = [{"rank": r, "left": a, "right": b, "merged": m, "gain": g,
                            "atom_aligned": atom_aligned(m)}
                           for r, ((a, b), m, g) in ranked[:config["top_k"]]]
    gains = [g for _, _, g in top_model.merge_log]
    out["merge_gains_nonincreasing"] = all(x >= y for x, y in zip(gains, gains[1:]))
    run.log("  top subwords by gain: " + ", ".join(f"{t['merged']} {t['gain']}"
                                                  for t in out["top_subwords"][:10]))
    if count_model is not None:
        ranked = sorted(enumerate(zip(count_model.merge_log, count_model.merge_counts)),
                        key=lambda rm: (-rm[1][1], rm[0]))
        out["top_subwords_count"] = [{"rank": r, "merged": m, "count": c, "gain": g}
                                     for r, ((_, m, g), c) in ranked[:config["top_k"]]]
        out["training_stop_count"] = {"n_merges_done": count_model.n_merges_done,
                                      "stopped_early": count_model.stopped_early,
                                      "n_initial_tokens": count_model.n_initial_tokens,
                                      "n_final_tokens": count_model.n_final_tokens}
    return out


def training_stop_and_ledger(run, top_model, model_name):
    """Why training of the largest model stopped, and its gain ledger (tokens before - after ==
    sum of the merge gains)."""
    gains = [g for _, _, g in top_model.merge_log]
    stop = {"num_merges_requested": top_model.num_merges_requested,
            "n_merges_done": top_model.n_merges_done, "stopped_early": top_model.stopped_early,
            "min_pair_freq": top_model.min_pair_freq, "last_gain": gains[-1] if gains else None,
            "n_merges_with_gain_2": sum(g == 2 for g in gains)}
    run.log(f"  training with num_merges={top_model.num_merges_requested}: {top_model.n_merges_done} "
            f"merges done, stopped_early={top_model.stopped_early}")
    sum_g = sum(gains)
    gl = {"model": model_name, "n_initial_tokens": top_model.n_initial_tokens,
          "n_final_tokens": top_model.n_final_tokens,
          "difference": top_model.n_initial_tokens - top_model.n_final_tokens, "sum_gains": sum_g,
          "exact": top_model.n_initial_tokens - top_model.n_final_tokens == sum_g}
    run.log(f"  gain ledger: {gl['n_initial_tokens']} - {gl['n_final_tokens']} = {gl['difference']}, "
            f"sum of gains {gl['sum_gains']} ({'exact' if gl['exact'] else 'MISMATCH'})")
    return {"training_stop": stop, "gain_ledger": gl}


def checks(schemes, split_idx, smiles):
    """The booleans of the smoke tests (see the docstring's ``checks``)."""
    train_idx, valid_idx, test_idx = split_idx
    bpes = [r for r in schemes if r["kind"] == "bpe"]
    gain_bpes = [r for r in bpes if r["criterion"] == "gain"]
    plain = [r for r in gain_bpes if not r["end_of_word"]]
    return {
        "split_902_113_113": (len(train_idx), len(valid_idx), len(test_idx)) == (902, 113, 113),
        "all_schemes_decode_exactly": all(r["decodable_fraction"] == 1.0 for r in schemes),
        "bpe_vocab_ledger_exact": all(r["vocab_ledger_exact"] for r in gain_bpes),
        "bpe_ledger_matches_independent_count": all(
            r["n_initial_tokens"] == r["n_initial_tokens_independent"] and r["gain_ledger_exact"]
            and r["train_tokens_encoded"] == r["n_final_tokens"] for r in gain_bpes),
        "rank_greedy_reproduces_training": all(r["rank_greedy_mismatches_train"] == 0 for r in gain_bpes),
        "rank_greedy_reproduces_replay_all": all(r["rank_greedy_mismatches_all"] == 0 for r in gain_bpes),
        "bpe_tokens_decrease_with_merges": all(a["total"] > b["total"] for a, b in zip(plain, plain[1:])
                                               if b["merges_done"] > a["merges_done"]),
        "no_whitespace_in_smiles": not any(any(c.isspace() for c in s) for s in smiles),
    }


# ---------------------------------------------------------------------------- main
def main():
    args, config, run = common.start("tokenization", __doc__, FULL, QUICK_OVERRIDES)
    n_stages = 5
    results = {"p95_definition": P95_DEFINITION}

    run.stage(1, n_stages, "ESOL and the scaffold split")
    smiles, split_idx, split_of = load_split(config)
    train_idx, valid_idx, test_idx = split_idx
    results["split"] = {"method": "chemdata.scaffold_split", "n_molecules": len(smiles),
                        "n_train": len(train_idx), "n_valid": len(valid_idx), "n_test": len(test_idx)}
    run.log(f"  {len(smiles)} molecules, split {len(train_idx)}/{len(valid_idx)}/{len(test_idx)}")

    run.stage(2, n_stages, "char- and atom-level tokenization")
    char_rec, _, results["char_vocabulary"] = fixed_scheme("char", chemdata.tokenize_chars, smiles,
                                                           split_of, train_idx)
    atom_rec, atom_toks, results["atom_vocabulary"] = fixed_scheme("atom", chemdata.tokenize_smiles,
                                                                   smiles, split_of, train_idx)

    run.stage(3, n_stages, "BPE models (trained on the training SMILES), encode/decode all molecules")
    bpe_recs, models = all_bpe_schemes(config, smiles, split_of, train_idx, atom_toks)
    schemes = [char_rec, atom_rec] + bpe_recs
    for rec in schemes:
        rec["sum_T2_rel_char"] = rec["sum_T2"] / char_rec["sum_T2"]
        rec["total_rel_char"] = rec["total"] / char_rec["total"]
    results["schemes"] = schemes
    log_schemes(run, schemes)

    run.stage(4, n_stages, "examples, top subwords, training stop, gain ledger")
    results["examples"] = examples(run, config, models, smiles, train_idx)
    k = config["top_subwords_model_merges"]
    results.update(top_subwords(run, config, models[(k, False)], models.get((k, False, "count"))))
    results.update(training_stop_and_ledger(run, models[(k, False)], results["top_subwords_model"]))

    run.stage(5, n_stages, "checks")
    results["checks"] = checks(schemes, split_idx, smiles)
    for key, v in results["checks"].items():
        run.log(f"  {key}: {v}")
    run.finish(results)


if __name__ == "__main__":
    main()
