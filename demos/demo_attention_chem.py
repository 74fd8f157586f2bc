"""Experiment 5 (the tutorial's section 10.5) - what the attention heads of the SMILES language model look at,
at both query positions.

What it does
------------
Loads experiment 4's model (``models/smiles_lm.json``; in QUICK mode the QUICK model in
<results folder>/models/, or ``--model PATH``) and reads its own vocabulary from the file's meta.  On
the ESOL validation and test SMILES of the same scaffold split, one training-style
``model.forward(ids[:-1])`` per molecule (input = <bos> + tokens; input position p holds token p-1)
leaves every head's causal attention matrix in ``block.self_attn.heads[h][3]`` (T x T).  Per layer and head:

* entropy, self, prev_token, prev_atom   over every query p >= 1 (as before: mean -sum a ln a in nats,
  mean a_pp, mean a_p,p-1, mean mass on the most recent atom before p);
* ring / branch partner mass at TWO query positions, for every token i that closes a ring (its label)
  or a branch (')'), partner token j (``smiles_grammar.closing_partners``):
  holding     query p = i + 1, the position that holds the closing token;
  predicting  query p = i, the position whose output predicts the closing token (the ablation's target);
  the key is the opening token, position j + 1, in both cases;
* a fixed-offset control for each of those four: the mean mass the same head puts at the same distance
  back (p - key), whatever token is there, over every query of the split (pooled by offset).

Baselines per relation over its own queries: uniform over the visible causal prefix (1/(p+1)) and
uniform over the whole molecule (1/T, the tutorial's "about 1/33").

Held-out ablation: ``model.forward`` with the attention's ``head_mask`` (one head's A_h V_h zeroed before
W_o; an all-ones mask reproduces ``model.forward`` exactly, a checked invariant) on every molecule, for
each of the 8 heads alone.  The named heads are CHOSEN ON THE VALIDATION MOLECULES: ring_head (most
ring-partner mass at the predicting query), branch_head (same for ')'), ring_ablation_head (largest
ring-closure minus overall ablation cost), prev_token_head, and random_head (random.Random(seed) among
the others).  They are SCORED ON THE TEST MOLECULES: bits/token overall, on ring-closure targets and on
branch-closing targets, each with a paired bootstrap over test molecules (evaluation.paired_bootstrap,
molecules resampled with all their tokens) against the intact model and against the random head.

Experiment 4's n-gram baseline: its test bits/token is copied from results_smiles_lm.json beside the
model (figures/ or the QUICK results folder) when that file has it, with the Transformer's.

How to read results_attention_chem.json (under "results")
-------------------------------------------------------
splits       {valid, test}: {n_molecules, heads, baselines, ablation}
  heads      list of {layer, head, entropy, self, prev_token, prev_atom, ring_holding, ring_predicting,
             branch_holding, branch_predicting, and <each of the four>_offset (the fixed-offset control)}
  baselines  {relation: {n_queries, causal_uniform, whole_molecule_uniform}}
  ablation   none: {bits_per_token, ring_bits_per_token, branch_bits_per_token, n_tokens, n_ring_tokens,
             n_branch_tokens}; per_head: list of {layer, head, bits_per_token, ring_bits_per_token,
             branch_bits_per_token, delta, ring_delta, branch_delta, (test only) ci: {all, ring, branch}:
             [low, high] 95 % of ablated - intact}
chosen       {name: {layer, head, chosen_by, valid_value, test: {delta, ring_delta, branch_delta},
             vs_random: {all, ring, branch}: paired_bootstrap dict (ablated this - ablated random head)}}
best         {relation: the test head with the most mass, its ratios to both baselines and its control}
ngram        {source, found, ngram_bits_per_token, transformer_bits_per_token, transformer_seed_sd, n_seeds}
model, checks, reading (demos/report_attention_chem.reading_text), headline

Run:  python demos/demo_attention_chem.py         (after demo_smiles_lm.py; about 3 CPU-minutes, 1.5-2 min on 2 cores)
      QUICK=1 python demos/demo_attention_chem.py (uses the QUICK model of the same results folder)
"""
import functools
import json
import math
import os
import random

import common

core = common.core
import chemdata  # noqa: E402  (imported after the sys.path set-up above)
import evaluation  # noqa: E402  (imported after the sys.path set-up above)
import smiles_grammar  # noqa: E402  (imported after the sys.path set-up above)
import report_attention_chem as report  # noqa: E402  (demos/report_attention_chem.py: reading, headline)
import report_kit  # noqa: E402  (number formatting)

LN2 = math.log(2.0)
EVERY_QUERY = ("self", "prev_token", "prev_atom")
PARTNERS = ("ring", "branch")
POSITIONS = ("holding", "predicting")
PARTNER_RELATIONS = tuple(f"{k}_{p}" for k in PARTNERS for p in POSITIONS)
RELATIONS = EVERY_QUERY + PARTNER_RELATIONS
FULL = dict(n_molecules=None, n_resamples=2000)
QUICK_OVERRIDES = dict(n_molecules=12, n_resamples=200)


def extra_args(p):
    p.add_argument("--model", default=None, help="model file (default: models/smiles_lm.json, or the QUICK "
                                                 "model in <results folder>/models/ with QUICK=1)")


# ----------------------------------------------------------------------------- which query, which key


@functools.lru_cache(maxsize=None)
def is_atom_token(token):
    """True for an atom token (the class smiles_grammar.SmilesConstraint's grammar gives it) and for <unk> (a rare
    atom symbol: the vocabulary keeps only the frequent ones)."""
    if token == "<unk>":
        return True
    vocab = chemdata.Vocab([token])
    return vocab.stoi[token] in smiles_grammar.SmilesConstraint(vocab).atom_ids


def every_query_keys(tokens):
    """For each input position p (0 = <bos>, p = token p-1): {self, prev_token, prev_atom: key position}."""
    out, last_atom = [dict()], None
    for p, tok in enumerate(tokens, start=1):
        rel = {"self": p, "prev_token": p - 1}
        if last_atom is not None:
            rel["prev_atom"] = last_atom
        if is_atom_token(tok):
            last_atom = p
        out.append(rel)
    return out


def partner_queries(tokens):
    """[(relation, query position, key position)] for every closing token i with partner j: the query
    that holds it is i + 1, the query that predicts it is i, the key (the opener) is j + 1."""
    out = []
    for i, partner in enumerate(smiles_grammar.closing_partners(tokens)):
        if partner is not None:
            kind, j = partner
            out += [(f"{kind}_holding", i + 1, j + 1), (f"{kind}_predicting", i, j + 1)]
    return out


def closing_targets(tokens, kind):
    """Target indices t (targets = ids[1:], so target t is token t) whose token closes a ``kind``."""
    return {i for i, p in enumerate(smiles_grammar.closing_partners(tokens)) if p is not None and p[0] == kind}


# ----------------------------------------------------------------------------- forward with a head mask


def masked_forward(model, ids, ablate=None):
    """``model.forward(ids)`` with head ``ablate`` = (layer, head) switched off through the attention's
    ``head_mask`` (factor 0: its O_h = A_h V_h is dropped before W_o; every other head keeps factor 1)."""
    H = model.blocks[0].self_attn.H
    for layer, b in enumerate(model.blocks):
        b.self_attn.head_mask = [0.0 if (layer, h) == ablate else 1.0 for h in range(H)]
    try:
        return model.forward(ids)
    finally:
        for b in model.blocks:
            b.self_attn.head_mask = None


def nll_bits(logits, targets):
    return [-core.log_softmax(row)[y] / LN2 for row, y in zip(logits, targets)]


# ----------------------------------------------------------------------------- per molecule


def head_stats(A, keys, partners):
    """One head's attention matrix A: per relation [(mass, offset)], entropies, offset sums and counts."""
    T = len(A)
    rec = {"entropy": [], "row_sum_err": 0.0, "offset_sum": [0.0] * T, "offset_n": [0] * T}
    for r in RELATIONS:
        rec[r] = []
    for p in range(1, T):
        row = A[p]
        rec["entropy"].append(-math.fsum(a * math.log(a) for a in row[:p + 1] if a > 0))
        rec["row_sum_err"] = max(rec["row_sum_err"], abs(math.fsum(row) - 1.0))
        for r, k in keys[p].items():
            rec[r].append((row[k], p - k))
        for d in range(p + 1):
            rec["offset_sum"][d] += row[p - d]
            rec["offset_n"][d] += 1
    for r, p, k in partners:
        rec[r].append((A[p][k], p - k))
    return rec


def analyse_molecule(model, ids, tokens, head_list):
    """Attention statistics and the per-ablation nll bits of one molecule."""
    inputs, targets = ids[:-1], ids[1:]
    logits = model.forward(inputs)
    keys, partners = every_query_keys(tokens), partner_queries(tokens)
    T = len(inputs)
    stats = {(layer, h): head_stats(A, keys, partners)
             for layer, b in enumerate(model.blocks) for h, (_, _, _, A) in enumerate(b.self_attn.heads)}
    base = {r: [(1.0 / (p + 1), 1.0 / T) for p in range(1, T) if r in keys[p]] for r in EVERY_QUERY}
    for r in PARTNER_RELATIONS:
        base[r] = [(1.0 / (p + 1), 1.0 / T) for rr, p, _ in partners if rr == r]
    recomputed = masked_forward(model, inputs)
    diff = max(abs(a - c) for ra, rc in zip(logits, recomputed) for a, c in zip(ra, rc))
    ablated = {hd: nll_bits(masked_forward(model, inputs, hd), targets) for hd in head_list}
    return {"stats": stats, "base": base, "plain": nll_bits(logits, targets), "ablated": ablated, "diff": diff,
            "ring_t": closing_targets(tokens, "ring"), "branch_t": closing_targets(tokens, "branch")}


# ----------------------------------------------------------------------------- aggregation


def mean(xs):
    return math.fsum(xs) / len(xs) if xs else None


def aggregate_heads(per_mol, head_list):
    """Per head: mean entropy and mass per relation; for the partner relations also the fixed-offset
    control (the head's mean mass at each instance's offset, pooled over every query of the split)."""
    heads = []
    for hd in head_list:
        recs = [m["stats"][hd] for m in per_mol]
        width = max(len(s["offset_n"]) for s in recs)
        osum, on = [0.0] * width, [0] * width
        for s in recs:
            for d, (v, n) in enumerate(zip(s["offset_sum"], s["offset_n"])):
                osum[d] += v
                on[d] += n
        out = {"layer": hd[0], "head": hd[1], "entropy": mean([v for s in recs for v in s["entropy"]])}
        for r in RELATIONS:
            pairs = [x for s in recs for x in s[r]]
            out[r] = mean([v for v, _ in pairs])
            if r in PARTNER_RELATIONS:
                out[r + "_offset"] = mean([osum[d] / on[d] for _, d in pairs])
        heads.append(out)
    return heads


def aggregate_baselines(per_mol):
    out = {}
    for r in RELATIONS:
        pairs = [p for m in per_mol for p in m["base"][r]]
        out[r] = {"n_queries": len(pairs), "causal_uniform": mean([a for a, _ in pairs]),
                  "whole_molecule_uniform": mean([b for _, b in pairs])}
    return out


def token_bits(per_mol, key=None, subset=None):
    """(bits, molecule index) of every target (or of the 'ring_t' / 'branch_t' ones), for one ablation."""
    vals, groups = [], []
    for i, m in enumerate(per_mol):
        row = m["plain"] if key is None else m["ablated"][key]
        for t, v in enumerate(row):
            if subset is None or t in m[subset]:
                vals.append(v)
                groups.append(i)
    return vals, groups


SUBSETS = (("all", None, ""), ("ring", "ring_t", "ring_"), ("branch", "branch_t", "branch_"))


def boot(per_mol, a, b, subset, n_resamples, seed):
    """Paired bootstrap over molecules of mean bits under ablation ``a`` minus under ``b`` (None: intact)."""
    va, groups = token_bits(per_mol, a, subset)
    vb, _ = token_bits(per_mol, b, subset)
    if not va:
        return None
    return evaluation.paired_bootstrap(None, va, vb, metric="mean", n_resamples=n_resamples, seed=seed, groups=groups)


def aggregate_ablation(per_mol, head_list, n_resamples=None, seed=0):
    """Intact and per-head bits/token (all, ring closures, branch closures); with ``n_resamples`` also
    the 95 % paired-bootstrap interval of each head's ablated - intact."""
    none = {}
    for name, subset, prefix in SUBSETS:
        vals, _ = token_bits(per_mol, None, subset)
        none[prefix + "bits_per_token"], none["n_" + (prefix or "") + "tokens"] = mean(vals), len(vals)
    per_head = []
    for hd in head_list:
        rec = {"layer": hd[0], "head": hd[1]}
        for name, subset, prefix in SUBSETS:
            b = mean(token_bits(per_mol, hd, subset)[0])
            rec[prefix + "bits_per_token"] = b
            rec[prefix + "delta"] = None if b is None else b - none[prefix + "bits_per_token"]
        if n_resamples:
            cis = {name: boot(per_mol, hd, None, subset, n_resamples, seed) for name, subset, _ in SUBSETS}
            rec["ci"] = {k: None if v is None else [v["ci_low"], v["ci_high"]] for k, v in cis.items()}
        per_head.append(rec)
    return {"none": none, "per_head": per_head}


def summarise(per_mol, head_list, n_resamples=None, seed=0):
    return {"n_molecules": len(per_mol), "heads": aggregate_heads(per_mol, head_list),
            "baselines": aggregate_baselines(per_mol),
            "ablation": aggregate_ablation(per_mol, head_list, n_resamples, seed)}


# ----------------------------------------------------------------------------- choose on valid, score on test


def choose_heads(valid, head_list, seed):
    """The named heads, chosen on the validation summary: {name: ((layer, head), chosen_by, value)}."""
    heads, per = valid["heads"], valid["ablation"]["per_head"]

    def top(rows, key, value):
        best = max(rows, key=lambda x: value(x) if value(x) is not None else -math.inf)
        return (best["layer"], best["head"]), key, value(best)

    def spec(p):
        return (None if p["ring_delta"] is None else p["ring_delta"] - p["delta"])
    pick = {"ring_head": top(heads, "ring_predicting mass", lambda h: h["ring_predicting"]),
            "branch_head": top(heads, "branch_predicting mass", lambda h: h["branch_predicting"]),
            "ring_ablation_head": top(per, "ring_delta - delta", spec),
            "prev_token_head": top(heads, "prev_token mass", lambda h: h["prev_token"])}
    named = {hd for hd, _, _ in pick.values()}
    others = [hd for hd in head_list if hd not in named] or head_list
    pick["random_head"] = (random.Random(seed).choice(others), "random.Random(seed) among the others", None)
    return pick


def score_chosen(pick, test_mol, test, n_resamples, seed):
    """Each chosen head on the test molecules, with paired bootstraps against the random head."""
    per = {(p["layer"], p["head"]): p for p in test["ablation"]["per_head"]}
    rand = pick["random_head"][0]
    out = {}
    for name, (hd, by, value) in pick.items():
        rec = {"layer": hd[0], "head": hd[1], "chosen_by": by, "valid_value": value,
               "test": {k: per[hd][k] for k in ("delta", "ring_delta", "branch_delta")}}
        if hd != rand:
            rec["vs_random"] = {n: boot(test_mol, hd, rand, s, n_resamples, seed) for n, s, _ in SUBSETS}
        out[name] = rec
    return out


def best_heads(heads, baselines):
    """Per relation: the head with the most mass, its ratio to both baselines and to its offset control."""
    out = {}
    for r in RELATIONS:
        top = max(heads, key=lambda x: x[r] if x[r] is not None else -1.0)
        base, m = baselines[r], top[r]
        def ratio(b):
            return (m / b if m is not None and b else None)
        out[r] = {"layer": top["layer"], "head": top["head"], "mass": m,
                  "ratio_to_causal_uniform": ratio(base["causal_uniform"]),
                  "ratio_to_whole_molecule_uniform": ratio(base["whole_molecule_uniform"])}
        if r in PARTNER_RELATIONS:
            out[r]["offset_control"] = top[r + "_offset"]
            out[r]["ratio_to_offset_control"] = ratio(top[r + "_offset"])
    return out


# ----------------------------------------------------------------------------- inputs


def model_file(args, run):
    if args.model:
        return args.model
    folder = os.path.join(run.out_dir, "models") if common.QUICK else os.path.join(common.ROOT, "models")
    return os.path.join(folder, "smiles_lm.json")


def ngram_record(run, model_path):
    """Experiment 4's n-gram and Transformer test bits/token from its results_smiles_lm.json: the one in
    the folder above the model's models/ folder, else in this run's results folder (found: False, and
    the reason, when the file or its n-gram entry is absent)."""
    folders = [os.path.dirname(os.path.dirname(os.path.abspath(model_path))), run.out_dir]
    path = next((p for p in (os.path.join(d, "results_smiles_lm.json") for d in folders) if os.path.exists(p)),
                os.path.join(run.out_dir, "results_smiles_lm.json"))
    rec = {"source": os.path.relpath(path, common.ROOT), "found": False, "ngram_bits_per_token": None,
           "transformer_bits_per_token": None, "transformer_seed_sd": None, "n_seeds": None}
    if not os.path.exists(path):
        rec["why_not"] = "no results_smiles_lm.json"
        return rec
    with open(path, encoding="utf-8") as f:
        r = json.load(f)["results"]
    rec.update(report.smiles_lm_bits(r))
    if rec["ngram_bits_per_token"] is None:
        rec["why_not"] = "results_smiles_lm.json has no n-gram test bits/token"
    rec["found"] = rec["ngram_bits_per_token"] is not None
    return rec


def molecules(vocab, esol, split, part, n):
    smiles = [esol.smiles[i] for i in split[part]][:n]
    tokens = [vocab.decode(vocab.encode(chemdata.tokenize_smiles(s)), strip_special=True) for s in smiles]
    return tokens, [vocab.encode(t) for t in tokens]


def analyse_split(model, tokens, ids, head_list, seed, tag):
    return core.parallel_map(lambda i, rng: analyse_molecule(model, ids[i], tokens[i], head_list),
                           range(len(ids)), seed=seed, progress=tag)


def checks(per_mol, test, meta, config):
    return {"masked_forward_matches_model": max(m["diff"] for m in per_mol) < 1e-9,
            "attention_rows_sum_to_1": all(s["row_sum_err"] < 1e-9 for m in per_mol for s in m["stats"].values()),
            "bits_match_training_record": meta.get("test_bits_per_token") is None
            or config.get("n_molecules") is not None
            or abs(test["ablation"]["none"]["bits_per_token"] - meta["test_bits_per_token"]) < 1e-9}


def main():
    args, config, run = common.start("attention_chem", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    run.stage(1, 4, "model, validation and test molecules")
    path = model_file(args, run)
    if not os.path.exists(path):
        raise SystemExit(f"no model at {path}: run demos/demo_smiles_lm.py first (same QUICK setting)")
    model = core.load_model(path)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)["meta"]
    vocab = chemdata.Vocab(meta["vocab"][len(chemdata.Vocab.SPECIALS):])
    esol = chemdata.load_esol()
    split = chemdata.scaffold_split(esol.smiles)
    head_list = [(layer, h) for layer in range(len(model.blocks)) for h in range(model.blocks[0].self_attn.H)]
    data = {part: molecules(vocab, esol, split, i, config["n_molecules"]) for part, i in (("valid", 1), ("test", 2))}
    run.log(f"  {len(data['valid'][0])} validation and {len(data['test'][0])} test molecules, "
            f"{len(head_list)} heads, model {path}")

    run.stage(2, 4, "attention statistics and head ablations (parallel_map over molecules)")
    per = {part: analyse_split(model, *data[part], head_list, args.seed, f"attention {part}") for part in data}

    run.stage(3, 4, "choose the named heads on validation, score them on test (paired bootstrap)")
    n_res = config["n_resamples"]
    splits = {"valid": summarise(per["valid"], head_list),
              "test": summarise(per["test"], head_list, n_res, args.seed)}
    chosen = score_chosen(choose_heads(splits["valid"], head_list, args.seed), per["test"], splits["test"],
                          n_res, args.seed)

    run.stage(4, 4, "aggregate")
    test = splits["test"]
    for h in test["heads"]:
        run.log("  L{layer} H{head}: entropy {entropy:.2f} self {self:.3f} prev {prev_token:.3f}".format(**h)
                + "".join(f" {r} {report_kit.fmt(h[r])}" for r in PARTNER_RELATIONS))
    results = {"splits": splits, "chosen": chosen, "best": best_heads(test["heads"], test["baselines"]),
               "n_molecules": test["n_molecules"], "ngram": ngram_record(run, path),
               "model": {"path": os.path.relpath(path, common.ROOT) if not args.model else path,
                         "git_commit": meta.get("git_commit"), "mode": meta.get("mode"),
                         "test_bits_per_token": meta.get("test_bits_per_token")},
               "checks": checks(per["valid"] + per["test"], test, meta, config)}
    results["reading"] = report.reading_text(results)
    results["headline"] = report.headline(results)[0]
    run.log(results["reading"])
    run.finish(results)


if __name__ == "__main__":
    main()
