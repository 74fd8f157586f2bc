"""Tests for bpe.py, the byte-pair-encoding tokenizer: the merge rule (tokens saved, or the raw pair count),
its gain ledger against independent counts, end-of-word markers, pre-split atom tokens, determinism,
round trips through encode/decode and JSON.

Run either way:
    python tests/tests_bpe.py                # zero third-party imports; one line per test
    python -m pytest tests/tests_bpe.py      # pytest collects the t_* functions (see pyproject.toml)
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bpe
from tests_transformer import _raises

# ----------------------------------------------------------------------------- a small SMILES corpus


_BPE_SMILES = [
    "OCC3OC(OCC2OC(OC(C#N)c1ccccc1)C(O)C(O)C2O)C(O)C(O)C3O", "Cc1occc1C(=O)Nc2ccccc2",
    "CC(C)=CCCC(C)=CC(=O)", "c1ccc2c(c1)ccc3c2ccc4c5ccccc5ccc43", "c1ccsc1",
    "c2ccc1scnc1c2", "Clc1cc(Cl)c(c(Cl)c1)c2c(Cl)cccc2Cl", "CC12CCC3C(CCc4cc(O)ccc34)C2CCC1O",
    "ClC4=C(Cl)C5(Cl)C3C1CC(C2OC12)C3C4(Cl)C5(Cl)Cl", "COc5cc4OCC3Oc2c1CC(Oc1ccc2C(=O)C3c4cc5OC)C(C)=C",
    "O=C1CCCN1", "Clc1ccc2ccccc2c1", "CCCC=C", "CCC1(C(=O)NCNC1=O)c2ccccc2", "CCCCCCCCCCCCCC",
    "CC(C)Cl", "CCC(C)CO", "N#CC(OC(=O)C(C(C)C)c1ccc(Cl)cc1)c2cccc(Oc3ccccc3)c2",
    "CCCCCCCC(=O)OC", "CCc1ccc(CC)cc1", "CCOP(=S)(OCC)SCSC(C)(C)C", "COC(=O)Nc1cccc(OC(=O)Nc2cccc(C)c2)c1",
    "ClC(=C)Cl", "Cc1cccc2c1Cc3ccccc32", "CCCCC(=O)OCC", "C[N+](=O)[O-]", "Brc1ccc(Br)cc1",
]


def _bpe_atoms(smiles):
    """Tiny SMILES atom splitter for the tests: bracket atoms, Cl, Br, else one character."""
    return re.findall(r"\[[^\]]+\]|Cl|Br|.", smiles)


def t_bpe_end_of_word_separates_prefix_and_suffix():
    corpus = ["old"] * 7 + ["older"] * 3 + ["finest"] * 9 + ["lowest"] * 4
    m = bpe.BPE().train(corpus, num_merges=10, end_of_word=True)
    assert m.merge_log[:3] == [(("e", "s"), "es", 13), (("es", "t"), "est", 13),
                               (("est", "</w>"), "est</w>", 13)]
    # the suffix token est</w> is not used inside a word, and decode strips </w>
    assert m.encode("lowest")[-1].endswith("est</w>")
    assert "est</w>" not in m.encode("estate")
    assert m.decode(m.encode("old  finest\tlowest")) == "old finest lowest"


def t_bpe_gain_ledger_handles_overlapping_pairs():
    m = bpe.BPE().train(["ccc"], num_merges=1, min_pair_freq=1)
    assert m.merge_log[0] == (("c", "c"), "cc", 1)  # naive pair count is 2
    assert m.encode("ccc") == ["cc", "c"]
    m = bpe.BPE().train(["ccc", "cccc", "ccccc"], num_merges=1)
    assert m.merge_log == [(("c", "c"), "cc", 1 + 2 + 2)]  # naive count 2 + 3 + 4 = 9
    # the merge is chosen by gain: (c,c) occurs 6 times in ccc x3 but saves only 3 tokens
    m = bpe.BPE().train(["ccc"] * 3 + ["ab"] * 4, num_merges=1)
    assert m.merge_log == [(("a", "b"), "ab", 4)]


def t_bpe_train_is_order_independent():
    ref = bpe.BPE().train(_BPE_SMILES, num_merges=60, min_pair_freq=1)
    rng = random.Random(7)
    for _ in range(2):
        corpus = list(_BPE_SMILES)
        rng.shuffle(corpus)
        m = bpe.BPE().train(corpus, num_merges=60, min_pair_freq=1)
        assert m.merge_log == ref.merge_log and m.vocab == ref.vocab
    # ties broken by the smallest pair: two pairs with gain 2 each
    m = bpe.BPE().train(["xy", "xy", "ab", "ab"], num_merges=1)
    assert m.merges == [("a", "b")]


def t_bpe_vocab_ledger():
    for n in (0, 1, 25, 500):
        m = bpe.BPE().train(_BPE_SMILES, num_merges=n)
        assert m.initial_symbols == sorted(set("".join(_BPE_SMILES)))
        assert len(m.vocab) == len(m.initial_symbols) + m.n_merges_done == len(set(m.vocab))
        assert m.vocab[len(m.initial_symbols):] == [a + b for a, b in m.merges]
        assert m.token_to_id == {t: i for i, t in enumerate(m.vocab)}


def t_bpe_gain_sum_equals_token_drop():
    corpus = _BPE_SMILES + _BPE_SMILES[:5]  # duplicates are counted with their frequency
    m = bpe.BPE().train(corpus, num_merges=80)
    initial = sum(len(s) for s in corpus)
    final = sum(len(m.encode(s)) for s in corpus)
    assert m.n_initial_tokens == initial and m.n_final_tokens == final
    assert sum(g for _, _, g in m.merge_log) == initial - final
    assert all(g >= 2 for _, _, g in m.merge_log)


def t_bpe_smiles_round_trip():
    m = bpe.BPE().train(_BPE_SMILES, num_merges=100)
    for s in _BPE_SMILES + ["CCN(CC)C(=O)c1ccccc1", "FC(F)(F)c1ccccc1", ""]:
        assert m.decode(m.encode(s)) == s
    ids = m.encode_ids(_BPE_SMILES[0])
    assert m.decode_ids(ids) == _BPE_SMILES[0]
    # F and I were never seen: they stay single tokens and are counted
    before = m.unknown_symbols
    toks = m.encode("FCI")
    assert "F" in toks and "I" in toks and m.unknown_symbols == before + 2
    _raises(KeyError, lambda: m.encode_ids("FCI"))


def t_bpe_encode_reproduces_training_segmentation():
    for end_of_word, corpus in ((False, _BPE_SMILES), (True, ["low lower lowest newest widest"] * 3)):
        m = bpe.BPE().train(corpus, num_merges=200, min_pair_freq=1, end_of_word=end_of_word)
        for item in corpus:
            assert m.encode(item) == m.replay(item)


def t_bpe_early_stop_when_no_pair_reaches_min_freq():
    m = bpe.BPE().train(_BPE_SMILES, num_merges=10_000, min_pair_freq=3)
    assert m.stopped_early and 0 < m.n_merges_done < 10_000
    assert min(g for _, _, g in m.merge_log) >= 3
    more = bpe.BPE().train(_BPE_SMILES, num_merges=10_000, min_pair_freq=2)
    assert more.n_merges_done > m.n_merges_done
    full = bpe.BPE().train(_BPE_SMILES, num_merges=5)
    assert not full.stopped_early and full.n_merges_done == 5
    assert bpe.BPE().train(["abc", "xyz"], num_merges=5).n_merges_done == 0  # every gain is 1


def _independent_pair_count(corpus, pair):
    """Occurrences of ``pair`` in character-split strings, counted by brute force."""
    return sum(1 for s in corpus for x, y in zip(s, s[1:]) if (x, y) == pair)


def t_bpe_count_criterion_ranks_by_raw_pair_count():
    # (c, c) occurs 6 times in ccc x3 (saving 3 tokens), (a, b) 4 times: the count rule takes (c, c)
    corpus = ["ccc"] * 3 + ["ab"] * 4
    m = bpe.BPE().train(corpus, num_merges=1, criterion="count")
    assert m.merges == [("c", "c")] and m.merge_counts == [_independent_pair_count(corpus, ("c", "c"))]
    assert m.merge_log[0][2] == 3                    # the ledger still records tokens actually saved
    assert bpe.BPE().train(corpus, num_merges=1).merges == [("a", "b")]   # the default is unchanged
    # the first merge of the count rule on real SMILES is the most frequent character pair
    m = bpe.BPE().train(_BPE_SMILES, num_merges=1, criterion="count")
    pairs = {(x, y) for s in _BPE_SMILES for x, y in zip(s, s[1:])}
    best = max(sorted(pairs), key=lambda p: _independent_pair_count(_BPE_SMILES, p))
    assert m.merges == [best] and m.merge_counts[0] == _independent_pair_count(_BPE_SMILES, best)
    _raises(ValueError, lambda: bpe.BPE().train(corpus, num_merges=1, criterion="frequency"))


def t_bpe_count_criterion_ledger_against_an_independent_count():
    corpus = _BPE_SMILES + _BPE_SMILES[:5]
    for criterion in bpe.CRITERIA:
        m = bpe.BPE().train(corpus, num_merges=120, criterion=criterion)
        replayed = sum(len(m.replay(s)) for s in corpus)          # training segmentation, recounted
        assert m.n_initial_tokens == sum(len(s) for s in corpus)
        assert m.n_final_tokens == replayed
        assert sum(g for _, _, g in m.merge_log) == m.n_initial_tokens - replayed
        assert all(m.decode(m.encode(s)) == s for s in corpus)
        assert len(m.vocab) == len(set(m.vocab)) == len(set(m.initial_symbols) | {x for _, x, _ in m.merge_log})
        again = bpe.BPE.from_json(m.to_json())
        assert again.criterion == criterion and again.merge_counts == m.merge_counts
        assert [again.encode(s) for s in corpus] == [m.encode(s) for s in corpus]


def t_bpe_presplit_atom_tokens_never_split():
    corpus = [_bpe_atoms(s) for s in _BPE_SMILES]
    m = bpe.BPE().train(corpus, num_merges=150, min_pair_freq=1)
    assert {"Cl", "Br", "[N+]", "[O-]"} <= set(m.initial_symbols) and "l" not in m.initial_symbols
    for atoms, s in zip(corpus, _BPE_SMILES):
        toks = m.encode(atoms)
        assert m.decode(toks) == s and toks == m.replay(atoms)
        # every token is a concatenation of whole atoms: its boundaries are atom boundaries
        cuts = {0}
        for a in atoms:
            cuts.add(max(cuts) + len(a))
        pos = 0
        for t in toks:
            pos += len(t)
            assert pos in cuts


def t_bpe_skips_merge_that_recreates_existing_symbol():
    # "Cl" is a pre-split token; gluing C + l would make a second "Cl" -> skipped
    m = bpe.BPE().train([["C", "l"]] * 3 + [["Cl", "C"]] * 2, num_merges=5)
    assert ("C", "l") in m.skipped_pairs and ("C", "l") not in m.merges
    assert m.merges == [("Cl", "C")] and len(m.vocab) == len(set(m.vocab)) == 4


def t_bpe_json_round_trip():
    m = bpe.BPE().train(_BPE_SMILES, num_merges=120)
    d = json.loads(json.dumps(m.to_json()))
    m2 = bpe.BPE.from_json(d)
    assert m2.merge_log == m.merge_log and m2.vocab == m.vocab and m2.to_json() == m.to_json()
    for s in _BPE_SMILES:
        assert m2.encode(s) == m.encode(s)
    w = bpe.BPE().train(["old older finest lowest"] * 2, num_merges=20, end_of_word=True)
    w2 = bpe.BPE.from_json(json.loads(json.dumps(w.to_json())))
    assert w2.end_of_word and w2.encode("oldest") == w.encode("oldest")


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
