"""Tests of generation_metrics.py: the n-gram baseline of experiment 4 (a distribution after every prefix,
chosen on validation) and the distribution metrics (the tutorial's novelty, MOSES, GuacaMol's KL and FCD) on
known answers.

Run with ``python -m pytest tests_generation_metrics.py`` or ``python tests_generation_metrics.py``.
"""

import contextlib
import math
import unittest

import chemdata
from tests_chemdata import _chem_required, _need_rdkit, slow


def _ngram_data():
    rng = __import__("random").Random(3)
    seqs = [[1] + [rng.randrange(4, 9) for _ in range(rng.randrange(1, 7))] + [2] for _ in range(40)]
    return seqs, chemdata.NgramLM(10, n=4, discount=0.75, bos_id=1).fit(seqs)


def t_ngram_probabilities_sum_to_one_after_every_prefix():
    """After every prefix (seen, unseen, of every length; ids never seen included) the n-gram's next-token
    distribution sums to 1 over the whole vocabulary, every id has p > 0, and next_logits = log p."""
    seqs, m = _ngram_data()
    for seq in seqs[:10] + [[1, 9, 9, 3, 0], [1]]:
        for t in range(1, len(seq) + 1):
            p = m.probs(seq[:t])
            assert len(p) == 10 and abs(math.fsum(p) - 1.0) < 1e-12 and min(p) > 0, (seq[:t], p)
            assert max(abs(a - math.log(b)) for a, b in zip(m.next_logits(seq[:t]), p)) < 1e-12


def t_ngram_choice_on_validation_and_bad_input():
    """fit_ngram picks the (n, discount) of lowest validation bits/token from its grid; a higher order fits
    the training data at least as well here; bad arguments raise ValueError naming the value."""
    seqs, _ = _ngram_data()
    best, grid = chemdata.fit_ngram(seqs[:30], seqs[30:], 10, 1, orders=(1, 2, 3), discounts=(0.5, 0.9))
    assert len(grid) == 6 and min(g["valid_bits_per_token"] for g in grid) == \
        chemdata.ngram_bits_per_token(best, seqs[30:])
    for bad in (dict(n=0), dict(discount=1.0), dict(n=2.5)):
        with contextlib.suppress(ValueError):
            chemdata.NgramLM(10, **bad)
            raise AssertionError(f"no ValueError for {bad}")
    with contextlib.suppress(ValueError):
        chemdata.NgramLM(10, n=2).fit([[1, 12, 2]])
        raise AssertionError("no ValueError for an id outside the vocabulary")


def t_tutorial_novelty_known_answer():
    """Hand-made: 6 samples, 1 invalid (None: e.g. no <eos>), 1 unparsable, 4 valid of which 3 unique
    (CCO twice, spelled two ways); the training set holds CCO.  The tutorial's novelty = novel unique /
    unique valid = 2/3; ours (novel valid / valid) = 2/4; uniqueness = unique valid / n = 3/6."""
    _need_rdkit()
    train = {chemdata.canonical_smiles("CCO")}
    r = chemdata.tutorial_novelty(["CCO", "OCC", "c1ccccc1", "CCN", None, "C1CC"], train)
    assert (r["n_valid"], r["n_unique_valid"]) == (4, 3)
    assert r["validity"] == 4 / 6 and r["uniqueness"] == 3 / 6
    assert abs(r["novelty"] - 2 / 3) < 1e-12 and r["novelty_of_valid"] == 2 / 4


def t_tutorial_scores_by_block_known_answer():
    """Blocks of 3 over 7 canonical samples (the 7th, an incomplete block, is left out).  Block 1: CCO
    twice and None -> validity 2/3, uniqueness 1/3, novelty 0 (CCO is in training); block 2: CCN, CCC,
    CCN -> 1, 2/3, 1.  Means 5/6, 1/2, 1/2; sample sd sqrt(1/2) x the gap.  Fewer samples than one block: None."""
    blocks = chemdata.tutorial_scores_by_block(["CCO", "CCO", None, "CCN", "CCC", "CCN", "CO"], {"CCO"}, 3)
    assert (blocks["size"], blocks["blocks"]) == (3, 2)
    for key, (a, b) in {"validity": (2 / 3, 1.0), "uniqueness": (1 / 3, 2 / 3), "novelty": (0.0, 1.0)}.items():
        assert abs(blocks[key]["mean"] - (a + b) / 2) < 1e-12, key
        assert abs(blocks[key]["sd"] - abs(a - b) / math.sqrt(2)) < 1e-12, key
    one = chemdata.tutorial_scores_by_block([None, None], set(), 2)
    assert one["blocks"] == 1 and one["validity"] == {"mean": 0.0, "sd": None} and one["novelty"]["mean"] is None
    assert chemdata.tutorial_scores_by_block(["CCO"], set(), 2) is None


def t_moses_metrics_known_values():
    """IntDiv1 of one molecule repeated is 0 (pairs i = j count, as MOSES); SNN of the reference itself is
    1; Frag and Scaf of a set against itself are 1; an acyclic set has no scaffold (None)."""
    _need_rdkit()
    ref = ["c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N"]
    m = chemdata.moses_metrics(ref, ref)
    assert abs(m["snn"] - 1) < 1e-12 and abs(m["frag"] - 1) < 1e-12 and abs(m["scaf"] - 1) < 1e-12
    assert chemdata.moses_metrics(["CCO"] * 3, ref)["int_div1"] == 0.0
    assert chemdata.moses_metrics(["CCO", "CCC"], ["CCN"])["scaf"] is None
    assert chemdata.length_histogram([0, 4, 5, 99, 250], edges=(0, 5, 100))["counts"] == [2, 3]


@slow
def t_guacamol_kl_and_fcd_on_a_tiny_set():
    """GuacaMol's KLDivBenchmark and fcd.get_fcd's steps run on a tiny set: a set against itself scores
    KL 1.0 and FCD ~0 (score ~1); a different set scores lower.  Skipped without the packages, except in
    CI (REQUIRE_CHEM=1), where they are installed and must run."""
    _need_rdkit()
    if not chemdata.distribution_packages_available():
        if _chem_required():
            raise ImportError(f"REQUIRE_CHEM=1 but guacamol / fcd are missing: {chemdata.GUACAMOL_HINT}")
        raise unittest.SkipTest(f"guacamol / fcd not installed ({chemdata.GUACAMOL_HINT})")
    ref = ["CCO", "c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N", "CC(C)Cl", "OC(=O)CCc1ccccc1", "CCCCBr",
           "Nc1ccc(Cl)cc1"]
    other = ["CCCCCCCC", "CCCCCCO", "C1CCCCC1", "CCCCCCCCCl", "c1ccncc1", "CCC(C)CCCC", "OCCO"]
    same, diff = chemdata.guacamol_kl_score(ref, ref), chemdata.guacamol_kl_score(other, ref)
    assert abs(same["score"] - 1.0) < 1e-9 and diff["score"] < same["score"], (same, diff)
    f_same, f_diff = chemdata.fcd_score(ref, ref), chemdata.fcd_score(other, ref)
    assert f_same["fcd"] < 1e-3 and f_diff["fcd"] > 1 and f_diff["score"] < f_same["score"], (f_same, f_diff)
    import fcd               # fcd_score keeps ChemNet in memory: it equals get_fcd on RDKit-canonical SMILES
    canon = chemdata.canonical_smiles
    want = fcd.get_fcd([canon(x) for x in other], [canon(x) for x in ref])
    assert abs(f_diff["fcd"] - want) < 1e-6 * max(1.0, want), (f_diff, want)
    assert set(chemdata.distribution_package_versions()) == {"guacamol", "fcd"}
    assert chemdata.guacamol_kl_score(["CCO"], ref)["score"] is None        # too few: None with the reason
    # at a fixed size: a set no larger is scored once, whole; a larger one as the mean over seeded subsets
    whole = chemdata.kl_score_at_size(other, ref, size=len(other))
    assert whole["repeats"] == 1 and whole["mean"] == diff["score"] and whole["sd"] == 0.0, whole
    sub = chemdata.kl_score_at_size(ref + other, ref, size=5, repeats=3, seed=1)
    assert sub["size"] == 5 and sub["repeats"] == 3 and len(sub["scores"]) == 3
    assert abs(sub["mean"] - sum(sub["scores"]) / 3) < 1e-12 and sub == chemdata.kl_score_at_size(
        ref + other, ref, size=5, repeats=3, seed=1)


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
