"""Experiment 4's candidate constraint (the ring limit and the lookahead), checked exhaustively: after every
prefix of every training molecule (ESOL's scaffold split) and of random walks, every token the constraint allows
has a completion (``SmilesConstraint.completion``) that the constraint accepts token by token and RDKit parses.

    python tools/completability.py                          # the whole training split and 100 walks, both cores
    python tools/completability.py --molecules 20 --walks 6 # the slow test's size
    python tools/completability.py --refused-only            # only which training molecules it refuses (a minute)

The constraint is the demo's candidate: ``demo_smiles_lm.CANDIDATE_OPTIONS`` (the ring limit resolved to the
training split's largest ring), on its 28-id vocabulary with its token budget.  Prints the counts (prefixes,
(prefix, token) pairs, pairs without a completion, completions RDKit refuses, walks that dead-end) and the
training molecules the constraint refuses, with the token it refuses first (a molecule it refuses cannot be
sampled whole: the price of the lookahead's bounded search).  Exit 1 on a pair without a completion, a refused
completion or a dead end.  Slow: each pair's completion is checked token by token (3 molecules and 2 walks,
1,017 pairs, took 190 CPU-s at 0c7f629, 196 at 610014d), so the whole split is hours; the suite runs the slow
test's 20.
"""
import argparse
import collections
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "demos")]

import chemdata  # noqa: E402  (imported after the sys.path set-up above)
import demo_smiles_lm as demo  # noqa: E402
import smiles_grammar  # noqa: E402
import transformer as core  # noqa: E402


def candidate_constraint():
    """(constraint, vocab, training token lists): the demo's candidate constraint on its 28-id vocabulary."""
    splits = demo.load_split(demo.FULL)
    tokens = [chemdata.tokenize_smiles(s) for s in splits["train"]]
    counts = collections.Counter(t for toks in tokens for t in toks)
    vocab = chemdata.Vocab(sorted(counts, key=lambda t: (-counts[t], t))[:demo.FULL["vocab_size"] - 4])
    options = demo.constraint_options_for(demo.CANDIDATE_OPTIONS, demo.TrainingSet.of(splits["train"]))
    budget = demo.constraint_budget(demo.FULL, tokens)
    return smiles_grammar.SmilesConstraint(vocab, max_new_tokens=budget, **options), vocab, tokens


def check_prefixes(look, vocab, prefixes):
    """Counts over ``prefixes``: pairs checked, pairs without a completion, completions RDKit refuses (with
    the first few), and the first refused prefix (a prefix the constraint does not allow), if any."""
    from rdkit import Chem, RDLogger
    RDLogger.DisableLog("rdApp.*")
    out = {"pairs": 0, "no_completion": [], "rdkit_refused": [], "refused_at": None}
    for prefix in prefixes:
        if look._state(tuple(prefix)) is None:
            out["refused_at"] = out["refused_at"] or prefix
            break
        for t in sorted(look(prefix) - {vocab.eos_id}):
            path = look.completion(prefix + [t])
            out["pairs"] += 1
            if path is None:
                out["no_completion"].append(vocab.decode(prefix + [t]))
                continue
            full = prefix + [t] + path
            smiles = "".join(vocab.itos[i] for i in full[1:-1])
            if not look.accepts(full[:-1]) or Chem.MolFromSmiles(smiles) is None:
                out["rdkit_refused"].append(smiles)
    return out


def walk(look, vocab, rng, max_tokens):
    """One uniform random walk through the allowed sets: (ids, "eos" | "dead end" | "max_tokens")."""
    ids = [vocab.bos_id]
    for _ in range(max_tokens):
        allowed = sorted(look(ids))
        if not allowed:
            return ids, "dead end"
        nxt = rng.choice(allowed)
        if nxt == vocab.eos_id:
            return ids, "eos"
        ids.append(nxt)
    return ids, "max_tokens"


def refused_only(look, vocab, mols, workers, t0):
    """--refused-only: each training molecule's prefixes, <eos> included, through the constraint's own path
    (only the tokens of the molecule are confirmed): the molecules it refuses and the token it refuses first."""
    def first_refused(ids, _rng):
        ids = ids + [vocab.eos_id]
        return next((ids[:k] for k in range(2, len(ids) + 1) if look._state(tuple(ids[:k])) is None), None)
    refused = [r for r in core.parallel_map(first_refused, mols, workers=workers, progress="refused") if r]
    why = collections.Counter(vocab.itos[r[-1]] for r in refused)
    print(f"training molecules the constraint refuses: {len(refused)} of {len(mols)} (first refused token: "
          f"{dict(why.most_common())}); e.g. " + ", ".join("".join(vocab.decode(r)) for r in refused[:5]))
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--molecules", type=int, default=None, help="the first N training molecules (default: all)")
    p.add_argument("--walks", type=int, default=100, help="random walks (default 100)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--refused-only", action="store_true",
                   help="only the training molecules (<eos> included) the constraint refuses: no pairs, no walks")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    look, vocab, tokens = candidate_constraint()
    unk = vocab.stoi["<unk>"]
    mols = [[vocab.bos_id] + [vocab.stoi.get(t, unk) for t in toks] for toks in tokens[:args.molecules]]
    if args.refused_only:
        return refused_only(look, vocab, mols, args.workers, t0)
    jobs = [("molecule", ids) for ids in mols] + [("walk", i) for i in range(args.walks)]

    def one(job, _rng):
        kind, x = job
        end = "eos"
        if kind == "walk":
            x, end = walk(look, vocab, random.Random(x), look.max_new_tokens)
        rec = check_prefixes(look, vocab, [x[:k] for k in range(1, len(x) + 1)])
        return dict(rec, kind=kind, end=end, text="".join(vocab.decode(x)))
    recs = core.parallel_map(one, jobs, workers=args.workers, progress="completability")
    refused = [r for r in recs if r["kind"] == "molecule" and r["refused_at"]]
    why = collections.Counter(vocab.itos[r["refused_at"][-1]] for r in refused)
    bad = sum(len(r["no_completion"]) + len(r["rdkit_refused"]) for r in recs)
    ends = collections.Counter(r["end"] for r in recs if r["kind"] == "walk")
    dead = ends["dead end"]
    print(f"{len(mols)} training molecules, {args.walks} walks: {sum(r['pairs'] for r in recs):,} (prefix, token) "
          f"pairs checked; without a completion {sum(len(r['no_completion']) for r in recs)}, completions RDKit "
          f"or the constraint refuses {sum(len(r['rdkit_refused']) for r in recs)}; walks ended by {dict(ends)}")
    print(f"training molecules the constraint refuses: {len(refused)} of {len(mols)} (first refused token: "
          f"{dict(why.most_common())}); e.g. " + ", ".join(r["text"] for r in refused[:5]))
    for r in recs:
        for s in r["no_completion"][:3] + r["rdkit_refused"][:3]:
            print("  FAILED:", s)
    print(f"{time.perf_counter() - t0:.0f} s")
    return 1 if bad or dead or ends["max_tokens"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
