"""Reaction product prediction: is a predicted product right, and what do simple baselines score.

Experiment 9 (USPTO-50K product prediction) scores a seq2seq model's products by exact string match and
RDKit validity; the demo also asks whether a product is the right molecule in another spelling, whether
it keeps to the reactants' atoms, and how far two baselines get.  All of it is here:

    canonical_match           the same molecule once RDKit has canonicalised both
    heavy_atom_counts, atoms_conserved   "reactant atoms in, product atoms out"
    reactants_by_size, copy_largest_reactant   the copy baseline (the largest reactant is the product)
    NearestReactionBaseline   the product of the most similar training reaction (Morgan Tanimoto)
    product_tanimoto          similarity of a prediction to the true product
    score_prediction          rank, validity, Tanimoto and conservation of one ranked prediction list
    random_spelling           a valid, non-canonical spelling of a molecule (same seed, same string)

Standard library only at module level; RDKit is imported by the functions that need it.  Callers import
this module by name (``import reactions; reactions.canonical_match(a, b)``).
"""

import random
from collections import Counter

from chemdata import import_rdkit, quiet_rdkit, canonical_smiles

__all__ = ["canonical_match", "heavy_atom_counts", "atoms_conserved", "reactants_by_size", "copy_largest_reactant",
           "product_tanimoto", "NearestReactionBaseline", "score_prediction", "random_spelling"]


# =====================================================================================
# Exact match, heavy atoms, baselines
# =====================================================================================

def _reaction_mol(smiles):
    """RDKit molecule of ``smiles``, or None if it is empty, not a string or unparsable; needs RDKit."""
    Chem = import_rdkit()
    if not isinstance(smiles, str) or not smiles.strip():
        return None
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def canonical_match(predicted, truth):
    """True if ``predicted`` is the same molecule as ``truth`` once RDKit has canonicalised both
    (a reordered or otherwise different valid spelling of the right product counts as a hit).

    An empty or unparsable prediction is never a match; an unparsable ``truth`` raises ValueError
    naming it (the reference answer must be a molecule).  Stereochemistry counts.  Needs RDKit.
    """
    import_rdkit()
    want = canonical_smiles(truth) if isinstance(truth, str) and truth.strip() else None
    if want is None:
        raise ValueError(f"canonical_match: the true product {truth!r} is not a valid SMILES")
    if _reaction_mol(predicted) is None:
        return False
    return canonical_smiles(predicted) == want


def heavy_atom_counts(smiles):
    """Counter {element symbol: number of heavy (non-hydrogen) atoms} of a SMILES (dots allowed),
    or None if it is empty or unparsable.  Explicit hydrogens and isotopes such as [2H] are not
    heavy atoms; charges are ignored.  Needs RDKit.

    >>> heavy_atom_counts("CC(=O)O")   # doctest: +SKIP
    Counter({'C': 2, 'O': 2})
    """
    mol = _reaction_mol(smiles)
    if mol is None:
        return None
    return Counter(a.GetSymbol() for a in mol.GetAtoms() if a.GetAtomicNum() > 1)


def atoms_conserved(product, reactants):
    """The "reactant atoms in, product atoms out" check: True if the heavy atoms of ``product`` are a
    sub-multiset of the heavy atoms of ``reactants`` (every element occurs at most as often in the
    product as in all reactants together).  An empty or unparsable product gives False; unparsable
    ``reactants`` raise ValueError naming them.  Needs RDKit."""
    have = heavy_atom_counts(reactants)
    if have is None:
        raise ValueError(f"atoms_conserved: the reactants {reactants!r} are not a valid SMILES")
    need = heavy_atom_counts(product)
    if need is None:
        return False
    return all(have[element] >= n for element, n in need.items())


def reactants_by_size(reactants):
    """The molecules of a dotted reactant side, largest first: by heavy-atom count, ties by the order
    in the input.  Unparsable fragments go last (counted as -1 heavy atoms).  Needs RDKit."""
    fragments = [f for f in reactants.split(".") if f]
    sizes = []
    for f in fragments:
        counts = heavy_atom_counts(f)
        sizes.append(-1 if counts is None else sum(counts.values()))
    order = sorted(range(len(fragments)), key=lambda i: (-sizes[i], i))
    return [fragments[i] for i in order]


def copy_largest_reactant(reactants, k=1):
    """The copy baseline: the reactant with the most heavy atoms is the predicted product.  Returns a
    ranked list of up to ``k`` predictions (the k largest reactants) so that top-k metrics apply."""
    return reactants_by_size(reactants)[:k]


def product_tanimoto(a, b, radius=2, n_bits=1024):
    """Morgan (radius 2, 1024 bits) Tanimoto similarity of two SMILES; 0.0 if either is empty or
    unparsable (an invalid prediction shares nothing with the truth).  Needs RDKit."""
    ma, mb = _reaction_mol(a), _reaction_mol(b)
    if ma is None or mb is None:
        return 0.0
    from rdkit import DataStructs
    fa, fb = _morgan_bitvects([ma, mb], radius, n_bits)
    return DataStructs.TanimotoSimilarity(fa, fb)


def _morgan_bitvects(mols, radius=2, n_bits=1024):
    """RDKit ExplicitBitVect Morgan fingerprints of RDKit molecules (same settings as morgan_fingerprints)."""
    from rdkit.Chem import rdFingerprintGenerator
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    return [generator.GetFingerprint(m) for m in mols]


class NearestReactionBaseline:
    """The nearest-training-reaction baseline: predict the product of the training reaction whose
    reactant side (one Morgan fingerprint of the whole dotted side, radius 2, 1024 bits) is most
    similar (Tanimoto) to the query's reactants.  Needs RDKit.

    ``predict(reactants, k)`` ranks the training reactions by similarity (ties: training order) and
    returns the products of the nearest ones, skipping a product already listed (by canonical SMILES),
    up to ``k`` of them.  Training rows whose reactants or product RDKit cannot parse are skipped and
    counted in ``n_skipped`` (their indices in ``skipped``).
    """

    def __init__(self, reactants, products, radius=2, n_bits=1024):
        if len(reactants) != len(products):
            raise ValueError(f"NearestReactionBaseline: {len(reactants)} reactant sides but "
                             f"{len(products)} products")
        self.radius, self.n_bits = radius, n_bits
        self.products, mols, self.skipped = [], [], []
        for i, (r, p) in enumerate(zip(reactants, products)):
            mol = _reaction_mol(r)
            if mol is None or _reaction_mol(p) is None:
                self.skipped.append(i)
                continue
            mols.append(mol)
            self.products.append(p)
        if not mols:
            raise ValueError("NearestReactionBaseline: no parsable training reaction")
        self.n_skipped = len(self.skipped)
        self.fingerprints = _morgan_bitvects(mols, radius, n_bits)

    def similarities(self, reactants):
        """Tanimoto similarity of ``reactants`` to every kept training reaction (training order);
        unparsable ``reactants`` raise ValueError naming them."""
        mol = _reaction_mol(reactants)
        if mol is None:
            raise ValueError(f"NearestReactionBaseline: query reactants {reactants!r} are not a valid SMILES")
        from rdkit import DataStructs
        query = _morgan_bitvects([mol], self.radius, self.n_bits)[0]
        return DataStructs.BulkTanimotoSimilarity(query, self.fingerprints)

    def predict(self, reactants, k=1):
        """Up to ``k`` distinct products of the nearest training reactions, nearest first."""
        sims = self.similarities(reactants)
        order = sorted(range(len(sims)), key=lambda i: (-sims[i], i))
        out, seen = [], set()
        for i in order:
            key = canonical_smiles(self.products[i])
            if key not in seen:
                seen.add(key)
                out.append(self.products[i])
                if len(out) == k:
                    break
        return out


def score_prediction(ranked, truth, reactants):
    """Chemical scores of one ranked prediction list (best first) against the true product.

    Returns a dict: ``rank`` (1-based rank of the first canonical match, None if none; top-k exact
    match is ``rank is not None and rank <= k``), ``valid`` (top-1 parses with RDKit), ``tanimoto``
    (Morgan Tanimoto of top-1 to the truth, 0.0 when top-1 is invalid or missing) and ``conserved``
    (top-1 passes ``atoms_conserved``).  An empty list scores as an invalid top-1.  Needs RDKit.
    """
    rank = next((i + 1 for i, p in enumerate(ranked) if canonical_match(p, truth)), None)
    top1 = ranked[0] if ranked else ""
    return {"rank": rank, "valid": _reaction_mol(top1) is not None,
            "tanimoto": product_tanimoto(top1, truth), "conserved": atoms_conserved(top1, reactants)}


def random_spelling(smiles, seed=0):
    """A valid but (usually) non-canonical spelling of the same molecule: RDKit writes it with the
    atoms renumbered in a random order drawn from ``random.Random(seed)``, so a seed always gives the
    same string.  Unparsable input raises ValueError naming it.  Needs RDKit."""
    mol = _reaction_mol(smiles)
    if mol is None:
        raise ValueError(f"random_spelling: {smiles!r} is not a valid SMILES")
    Chem = import_rdkit()
    order = list(range(mol.GetNumAtoms()))
    random.Random(seed).shuffle(order)
    return Chem.MolToSmiles(Chem.RenumberAtoms(mol, order), canonical=False)
