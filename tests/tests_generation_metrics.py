"""Tests of generation_metrics.py: the n-gram baseline of experiment 4 (a distribution after every prefix,
chosen on validation) and the distribution metrics (the tutorial's novelty, MOSES, GuacaMol's KL and FCD) on
known answers.

Run with ``python -m pytest tests/tests_generation_metrics.py`` or ``python tests/tests_generation_metrics.py``.
"""

import contextlib
import math
import unittest

import chemdata
import generation_metrics
from tests_chemdata import _chem_required, _need_rdkit, slow


def _ngram_data():
    rng = __import__("random").Random(3)
    seqs = [[1] + [rng.randrange(4, 9) for _ in range(rng.randrange(1, 7))] + [2] for _ in range(40)]
    return seqs, generation_metrics.NgramLM(10, n=4, discount=0.75, bos_id=1).fit(seqs)


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
    best, grid = generation_metrics.fit_ngram(seqs[:30], seqs[30:], 10, 1, orders=(1, 2, 3), discounts=(0.5, 0.9),
                                              variants=("interpolated",))
    assert len(grid) == 6 and min(g["valid_bits_per_token"] for g in grid) == \
        generation_metrics.ngram_bits_per_token(best, seqs[30:])
    for bad in (dict(n=0), dict(discount=1.0), dict(n=2.5), dict(variant="katz"),
                dict(variant="modified", discount=2.5), dict(variant="modified", discount=0.0)):
        with contextlib.suppress(ValueError):
            generation_metrics.NgramLM(10, **bad)
            raise AssertionError(f"no ValueError for {bad}")
    with contextlib.suppress(ValueError):
        generation_metrics.NgramLM(10, n=2).fit([[1, 12, 2]])
        raise AssertionError("no ValueError for an id outside the vocabulary")


def t_ngram_interpolated_numbers_unchanged():
    """Back-compatibility: NgramLM(V, n, D) is still interpolated Kneser-Ney with one discount, and its
    validation bits/token are the numbers the single-variant code gave at a0fe309 (the default discount is
    still 0.75); bits() (one probability per target) agrees with probs() (the whole row)."""
    seqs, m = _ngram_data()
    assert (m.variant, m.n, m.discount, m.discounts) == ("interpolated", 4, 0.75, [(0.75,) * 3] * 4)
    old = {(4, 0.75): 2.9396354001567935, (2, 0.5): 2.668439799644814}
    for (n, d), want in old.items():
        lm = generation_metrics.NgramLM(10, n, d, bos_id=1).fit(seqs[:30])
        got = generation_metrics.ngram_bits_per_token(lm, seqs[30:])
        assert abs(got - want) < 1e-12, (n, d, got, want)
    assert generation_metrics.NgramLM(10).discount == 0.75
    assert generation_metrics.NgramLM(10, variant="modified").discount is None
    for seq in seqs[30:]:
        want = [-math.log2(m.probs(seq[:t])[seq[t]]) for t in range(1, len(seq))]
        assert max(abs(a - b) for a, b in zip(m.bits(seq), want)) < 1e-12


def t_modified_kneser_ney_discounts_from_count_of_counts():
    """Chen & Goodman's estimates (eq. 26): counts-of-counts n1..n4 = 10, 4, 2, 1 give Y = 10/18 = 5/9,
    D1 = 1 - 2 Y 4/10 = 5/9, D2 = 2 - 3 Y 2/4 = 7/6, D3+ = 3 - 4 Y 1/2 = 17/9.  Out of (0, c) an estimate
    is clipped into [0.01, c - 0.01]; a zero count-of-count in a denominator falls back (Y to 0.5, D_c to
    D_(c-1))."""
    est = generation_metrics._estimated_discounts
    for got, want in zip(est([10, 4, 2, 1]), (5 / 9, 7 / 6, 17 / 9)):
        assert abs(got - want) < 1e-12, (got, want)
    assert est([1, 1, 10, 0]) == (1 - 2 / 3, 0.01, 2.99)       # D2 = 2 - 10 < 0, D3+ = 3 (n4 = 0): clipped
    assert est([0, 3, 1, 0]) == (0.5, 1.5, 2.99)                # no singletons: Y = D1 = 0.5
    assert est([0, 0, 0, 0]) == (0.5, 0.5, 0.5)                 # nothing counted: one discount 0.5
    order = {(1,): chemdata.Counter({4: 1, 5: 3}), (2,): chemdata.Counter({4: 1, 6: 2})}
    assert generation_metrics.count_of_counts(order) == [2, 1, 1, 0]


def t_modified_kneser_ney_formula_by_hand():
    """P(w | h) = (c(h w) - D(c(h w))) / c(h) + gamma(h) P(w | h'), gamma(h) = (D1 N1(h .) + D2 N2(h .)
    + D3+ N3+(h .)) / c(h) (Chen & Goodman eqs. 17-19), checked on a bigram of three sequences: after
    <bos> (id 1) come 4 twice and 5 once, so c(1 .) = 3, N1 = N2 = 1 and P(5 | 1) = (1 - D1) / 3 +
    (D1 + D2) / 3 P(5); the unigram is the continuation counts (4, 5, 2 each follow 2 distinct ids) with
    uniform: P(5) = (2 - D2') / 6 + 3 D2' / 6 x 1/6.  The top order's count-of-counts are n1..n4 = 4, 2, 0, 0."""
    m = generation_metrics.NgramLM(6, n=2, bos_id=1, variant="modified").fit([[1, 4, 5, 2], [1, 4, 4, 2], [1, 5, 2]])
    (u1, u2, _), (d1, d2, _) = m.discounts
    assert generation_metrics.count_of_counts(m.counts[1]) == [4, 2, 0, 0] and (d1, d2) == (0.5, 1.99)   # Y = 1/2
    p_uni = (2 - u2) / 6 + 3 * u2 / 6 / 6
    want = (1 - d1) / 3 + (d1 + d2) / 3 * p_uni
    assert abs(m.probs([1])[5] - want) < 1e-12 and abs(2 ** -m.bits([1, 5])[0] - want) < 1e-12


def _every_history(m, extra):
    """Every history the model has counts for, at every order, and a few never seen."""
    return [list(h) for order in m.counts for h in order] + extra


def t_modified_kneser_ney_sums_to_one_for_every_history_order():
    """For the modified variant (estimated discounts and a scale of them), at n = 1..5, after every history
    with counts at every order and after unseen ones, P(. | h) sums to 1 over the vocabulary (gamma(h)
    gives back exactly what the discounts took) and every p > 0; bits() agrees with the row."""
    seqs, _ = _ngram_data()
    for n in range(1, 6):
        for scale in (None, 0.3, 1.0):
            m = generation_metrics.NgramLM(10, n=n, discount=scale, bos_id=1, variant="modified").fit(seqs)
            assert m.variant == "modified" and m.discount == scale and len(m.discounts) == n
            assert all(0 < d < c for ds in m.discounts for c, d in zip((1, 2, 3), ds)), m.discounts
            for h in _every_history(m, [[9, 9, 0], [3], []]):
                p = m.probs(h)
                assert len(p) == 10 and abs(math.fsum(p) - 1.0) < 1e-12 and min(p) > 0, (n, scale, h, p)
                for w in (2, 4, 9) if h else ():
                    assert abs(2 ** -m.bits(h + [w])[-1] - p[w]) < 1e-12, (n, scale, h, w)


def t_fit_ngram_chooses_the_validation_minimum_over_both_variants():
    """fit_ngram tries each (variant, n, discount): D for interpolated, the same values and 1.0 as scales
    for modified; the returned model is the grid row of least validation bits/token, with its variant, n
    and discount, and scores that minimum itself; counts shared across smoothings give the numbers of a
    fresh fit."""
    seqs, _ = _ngram_data()
    train, valid = seqs[:30], seqs[30:]
    best, grid = generation_metrics.fit_ngram(train, valid, 10, 1, orders=(1, 2, 3, 4), discounts=(0.25, 0.5, 0.9))
    assert len(grid) == 4 * (3 + 3 + len(generation_metrics.SCALE_GRID))
    assert {g["variant"] for g in grid} == {"interpolated", "modified"}
    modified = sorted({g["discount"] for g in grid if g["variant"] == "modified"})
    assert modified == [0.25, 0.5, 0.9] + list(generation_metrics.SCALE_GRID)
    low = min(grid, key=lambda g: g["valid_bits_per_token"])
    assert (best.variant, best.n, best.discount) == (low["variant"], low["n"], low["discount"])
    assert generation_metrics.ngram_bits_per_token(best, valid) == low["valid_bits_per_token"]
    fresh = generation_metrics.NgramLM(10, best.n, best.discount, 1, best.variant).fit(train)
    assert abs(generation_metrics.ngram_bits_per_token(fresh, valid) - low["valid_bits_per_token"]) < 1e-12
    with contextlib.suppress(ValueError):
        generation_metrics.fit_ngram(train, valid, 10, 1, variants=("katz",))
        raise AssertionError("no ValueError for an unknown variant")


def t_ngram_choice_interior_on_toy_grids():
    """Interior = strictly between the smallest and largest value tried for the chosen variant: n = 3 of
    2..4 is interior, n = 4 is not; a modified scale of 1.0 (the largest tried) is not; the other variant's
    values do not count; one value tried is never interior; a choice not in the grid raises ValueError."""
    def row(v, n, d):
        return {"variant": v, "n": n, "discount": d, "valid_bits_per_token": 1.0}
    grid = [row("interpolated", n, d) for n in (2, 3, 4) for d in (0.1, 0.5, 0.9)] + \
        [row("modified", n, d) for n in (2, 3, 4, 5) for d in (0.5, 1.0)]
    inside = generation_metrics.ngram_choice_interior
    assert inside(grid, row("interpolated", 3, 0.5)) == {"n_interior": True, "discount_interior": True}
    assert inside(grid, row("interpolated", 4, 0.5)) == {"n_interior": False, "discount_interior": True}
    assert inside(grid, row("interpolated", 3, 0.9)) == {"n_interior": True, "discount_interior": False}
    assert inside(grid, row("modified", 4, 1.0)) == {"n_interior": True, "discount_interior": False}
    one = [row("interpolated", 3, 0.5)]
    assert inside(one, one[0]) == {"n_interior": False, "discount_interior": False}
    m = generation_metrics.NgramLM(10, n=3, discount=0.5)
    assert inside(grid, m) == {"n_interior": True, "discount_interior": True}      # an NgramLM as the choice
    with contextlib.suppress(ValueError):
        inside(grid, row("modified", 3, 0.7))
        raise AssertionError("no ValueError for a choice outside the grid")


def t_molecule_shape_known_answers():
    """Heavy atoms, SSSR ring count and largest ring: benzene 6 / 1 / 6; a 12-membered carbocycle 12 / 1 /
    12; naphthalene 10 / 2 / 6; ethanol 3 / 0 / 0; cubane's SSSR has 5 four-membered rings (not the 6 of
    the symmetrised set); hydrogens are not heavy atoms; unparsable, empty and None give None."""
    _need_rdkit()
    shape = generation_metrics.molecule_shape
    cases = {"c1ccccc1": (6, 1, 6), "C1CCCCCCCCCCC1": (12, 1, 12), "c1ccc2ccccc2c1": (10, 2, 6),
             "CCO": (3, 0, 0), "C12C3C4C1C5C2C3C45": (8, 5, 4), "[H]OC([H])([H])[H]": (2, 0, 0)}
    for smiles, (atoms, rings, largest) in cases.items():
        assert shape(smiles) == {"heavy_atoms": atoms, "rings": rings, "largest_ring": largest}, smiles
    assert shape("C1CC") is None and shape("") is None and shape(None) is None


def t_shape_summary_known_answer():
    """Benzene, the 12-ring, ethanol, naphthalene and one unparsable string: 4 valid, mean heavy atoms
    (6 + 12 + 3 + 10) / 4 = 31/4, ring counts {0: 1, 1: 2, 2: 1}, and 1 of the 4 valid (the 12-ring) has a
    ring larger than 8 (1/4; none larger than 12).  No valid molecule: means and shares None."""
    _need_rdkit()
    s = generation_metrics.shape_summary(["c1ccccc1", "C1CCCCCCCCCCC1", "CCO", "c1ccc2ccccc2c1", "C1CC"])
    assert (s["n"], s["n_valid"], s["mean_heavy_atoms"]) == (5, 4, 31 / 4)
    assert s["heavy_atoms_hist"] == {3: 1, 6: 1, 10: 1, 12: 1} and s["ring_count_hist"] == {0: 1, 1: 2, 2: 1}
    assert s["share_ring_larger_than"] == 1 / 4
    assert generation_metrics.shape_summary(["C1CCCCCCCCCCC1"], train_max_ring=12)["share_ring_larger_than"] == 0
    none = generation_metrics.shape_summary(["C1CC", None])
    assert none["n_valid"] == 0 and none["mean_heavy_atoms"] is None and none["share_ring_larger_than"] is None


def t_ks_statistic_known_answers_and_scipy():
    """D = sup_x |F_a(x) - F_b(x)|: identical samples 0, disjoint ones 1; {1, 2, 3} vs {2, 3, 4}: at x = 1
    F_a - F_b = 1/3 (and 1/3 at 2 and 3), so D = 1/3.  Ties (within and between samples): {1, 1, 2} vs
    {1, 2, 2}: at x = 1, 2/3 - 1/3 = 1/3.  Against scipy.stats.ks_2samp's statistic on tie-heavy integer
    samples when scipy is importable; an empty sample raises ValueError."""
    ks = generation_metrics.ks_statistic
    assert ks([1, 2, 3], [3, 2, 1]) == 0 and ks([1, 2], [5, 6, 7]) == 1
    assert abs(ks([1, 2, 3], [2, 3, 4]) - 1 / 3) < 1e-15 and abs(ks([1, 1, 2], [1, 2, 2]) - 1 / 3) < 1e-15
    with contextlib.suppress(ValueError):
        ks([], [1])
        raise AssertionError("no ValueError for an empty sample")
    try:
        from scipy.stats import ks_2samp
    except ImportError:
        raise unittest.SkipTest("scipy not installed: the comparison with ks_2samp is skipped")
    rng = __import__("random").Random(5)
    for _ in range(50):
        a = [rng.randrange(0, 8) for _ in range(rng.randrange(1, 30))]
        b = [rng.randrange(2, 10) for _ in range(rng.randrange(1, 30))]
        assert abs(ks(a, b) - float(ks_2samp(a, b).statistic)) < 1e-12, (a, b)


def t_validity_by_length_known_answer():
    """Bins [lo, hi) labelled "lo-(hi-1)" and the open last one "lo+": lengths 5, 9 (valid, invalid) fall
    in 0-9 (validity 1/2), 10 in 10-19, 60 and 200 in 60+; an empty bin has validity None; a length in no
    bin and lists of unequal length raise ValueError."""
    rows = generation_metrics.validity_by_length([5, 9, 10, 60, 200], [True, False, True, True, False])
    assert [r["bin"] for r in rows] == ["0-9", "10-19", "20-29", "30-59", "60+"]
    assert [(r["n"], r["valid"]) for r in rows] == [(2, 1), (1, 1), (0, 0), (0, 0), (2, 1)]
    assert [r["validity"] for r in rows] == [0.5, 1.0, None, None, 0.5]
    for args in (([-1], [True]), ([3, 4], [True])):
        with contextlib.suppress(ValueError):
            generation_metrics.validity_by_length(*args)
            raise AssertionError(f"no ValueError for {args}")


def t_tutorial_novelty_known_answer():
    """Hand-made: 6 samples, 1 invalid (None: e.g. no <eos>), 1 unparsable, 4 valid of which 3 unique
    (CCO twice, spelled two ways); the training set holds CCO.  The tutorial's novelty = novel unique /
    unique valid = 2/3; ours (novel valid / valid) = 2/4; uniqueness = unique valid / n = 3/6."""
    _need_rdkit()
    train = {chemdata.canonical_smiles("CCO")}
    r = generation_metrics.tutorial_novelty(["CCO", "OCC", "c1ccccc1", "CCN", None, "C1CC"], train)
    assert (r["n_valid"], r["n_unique_valid"]) == (4, 3)
    assert r["validity"] == 4 / 6 and r["uniqueness"] == 3 / 6
    assert abs(r["novelty"] - 2 / 3) < 1e-12 and r["novelty_of_valid"] == 2 / 4


def t_tutorial_scores_by_block_known_answer():
    """Blocks of 3 over 7 canonical samples (the 7th, an incomplete block, is left out).  Block 1: CCO
    twice and None -> validity 2/3, uniqueness 1/3, novelty 0 (CCO is in training); block 2: CCN, CCC,
    CCN -> 1, 2/3, 1.  Means 5/6, 1/2, 1/2; sample sd sqrt(1/2) x the gap.  Fewer samples than one block: None."""
    blocks = generation_metrics.tutorial_scores_by_block(["CCO", "CCO", None, "CCN", "CCC", "CCN", "CO"], {"CCO"}, 3)
    assert (blocks["size"], blocks["blocks"]) == (3, 2)
    for key, (a, b) in {"validity": (2 / 3, 1.0), "uniqueness": (1 / 3, 2 / 3), "novelty": (0.0, 1.0)}.items():
        assert abs(blocks[key]["mean"] - (a + b) / 2) < 1e-12, key
        assert abs(blocks[key]["sd"] - abs(a - b) / math.sqrt(2)) < 1e-12, key
    one = generation_metrics.tutorial_scores_by_block([None, None], set(), 2)
    assert one["blocks"] == 1 and one["validity"] == {"mean": 0.0, "sd": None} and one["novelty"]["mean"] is None
    assert generation_metrics.tutorial_scores_by_block(["CCO"], set(), 2) is None


def t_moses_metrics_known_values():
    """IntDiv1 of one molecule repeated is 0 (pairs i = j count, as MOSES); SNN of the reference itself is
    1; Frag and Scaf of a set against itself are 1; an acyclic set has no scaffold (None)."""
    _need_rdkit()
    ref = ["c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N"]
    m = generation_metrics.moses_metrics(ref, ref)
    assert abs(m["snn"] - 1) < 1e-12 and abs(m["frag"] - 1) < 1e-12 and abs(m["scaf"] - 1) < 1e-12
    assert generation_metrics.moses_metrics(["CCO"] * 3, ref)["int_div1"] == 0.0
    assert generation_metrics.moses_metrics(["CCO", "CCC"], ["CCN"])["scaf"] is None
    assert generation_metrics.length_histogram([0, 4, 5, 99, 250], edges=(0, 5, 100))["counts"] == [2, 3]


@slow
def t_guacamol_kl_and_fcd_on_a_tiny_set():
    """GuacaMol's KLDivBenchmark and fcd.get_fcd's steps run on a tiny set: a set against itself scores
    KL 1.0 and FCD ~0 (score ~1); a different set scores lower.  Skipped without the packages, except in
    CI (REQUIRE_CHEM=1), where they are installed and must run."""
    _need_rdkit()
    if not generation_metrics.distribution_packages_available():
        if _chem_required():
            raise ImportError(f"REQUIRE_CHEM=1 but guacamol / fcd are missing: {generation_metrics.GUACAMOL_HINT}")
        raise unittest.SkipTest(f"guacamol / fcd not installed ({generation_metrics.GUACAMOL_HINT})")
    ref = ["CCO", "c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N", "CC(C)Cl", "OC(=O)CCc1ccccc1", "CCCCBr",
           "Nc1ccc(Cl)cc1"]
    other = ["CCCCCCCC", "CCCCCCO", "C1CCCCC1", "CCCCCCCCCl", "c1ccncc1", "CCC(C)CCCC", "OCCO"]
    same, diff = generation_metrics.guacamol_kl_score(ref, ref), generation_metrics.guacamol_kl_score(other, ref)
    assert abs(same["score"] - 1.0) < 1e-9 and diff["score"] < same["score"], (same, diff)
    f_same, f_diff = generation_metrics.fcd_score(ref, ref), generation_metrics.fcd_score(other, ref)
    assert f_same["fcd"] < 1e-3 and f_diff["fcd"] > 1 and f_diff["score"] < f_same["score"], (f_same, f_diff)
    import fcd               # fcd_score keeps ChemNet in memory: it equals get_fcd on RDKit-canonical SMILES
    canon = chemdata.canonical_smiles
    want = fcd.get_fcd([canon(x) for x in other], [canon(x) for x in ref])
    assert abs(f_diff["fcd"] - want) < 1e-6 * max(1.0, want), (f_diff, want)
    assert set(generation_metrics.distribution_package_versions()) == {"guacamol", "fcd"}
    assert generation_metrics.guacamol_kl_score(["CCO"], ref)["score"] is None        # too few: None with the reason
    # at a fixed size: a set no larger is scored once, whole; a larger one as the mean over seeded subsets
    whole = generation_metrics.kl_score_at_size(other, ref, size=len(other))
    assert whole["repeats"] == 1 and whole["mean"] == diff["score"] and whole["sd"] == 0.0, whole
    sub = generation_metrics.kl_score_at_size(ref + other, ref, size=5, repeats=3, seed=1)
    assert sub["size"] == 5 and sub["repeats"] == 3 and len(sub["scores"]) == 3
    assert abs(sub["mean"] - sum(sub["scores"]) / 3) < 1e-12 and sub == generation_metrics.kl_score_at_size(
        ref + other, ref, size=5, repeats=3, seed=1)


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
