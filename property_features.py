"""Inputs for the property studies' models and baselines: augmented SMILES, descriptors, element
fractions, formula orders and element features.

    1. featurizations     randomized_smiles (experiment 6: several spellings of one molecule),
                          esol_descriptors (Delaney's four descriptors for experiment 6's ridge
                          baseline), molecule_element_fractions (experiment 8's ridge on element
                          fractions), formula_reordered, formula_orders (experiment 7: does a
                          prediction move when a formula is written in another element order)
    2. element features   element_features, token_feature_matrix (experiment 7: periodic-table
                          priors for a formula model; ELEMENT_FEATURE_NAMES, ELEMENT_FEATURE_SOURCE)

Standard library only at module level; RDKit is imported by the functions that need it.  Callers import
this module by name (``import property_features; property_features.element_features(...)``).
"""

import itertools
import math
from collections import Counter

from chemdata import import_rdkit, quiet_rdkit
from formulas import FRACTION_ELEMENTS, ELEMENT_AMOUNT, SIMPLE_FORMULA, element_fractions

__all__ = ["randomized_smiles", "esol_descriptors", "molecule_element_fractions", "formula_reordered",
           "formula_orders", "ELEMENT_FEATURE_NAMES", "ELEMENT_FEATURE_SOURCE", "element_features",
           "token_feature_matrix"]


# =====================================================================================
# 1. Featurizations: randomized SMILES, ESOL descriptors, element fractions, formula orders
# =====================================================================================

def randomized_smiles(smiles, n, rng):
    """``n`` random (non-canonical) SMILES of one molecule, atoms renumbered with ``rng`` (a
    ``random.Random``), so the same seed gives the same strings.  Repeats are possible for small
    molecules.  An unparsable SMILES raises ValueError naming it.  Needs RDKit."""
    Chem = import_rdkit()
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"invalid SMILES {smiles!r}: RDKit cannot parse it")
    out = []
    for _ in range(n):
        order = list(range(mol.GetNumAtoms()))
        rng.shuffle(order)
        out.append(Chem.MolToSmiles(Chem.RenumberAtoms(mol, order), canonical=False))
    return out


def esol_descriptors(smiles):
    """Delaney's four ESOL descriptors with RDKit: [clogP (Crippen), molecular weight, rotatable
    bonds, aromatic proportion (aromatic heavy atoms / heavy atoms)].  Needs RDKit."""
    Chem = import_rdkit()
    from rdkit.Chem import Crippen, Descriptors, Lipinski
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"invalid SMILES {smiles!r}: RDKit cannot parse it")
    heavy = mol.GetNumHeavyAtoms()
    aromatic = sum(1 for a in mol.GetAtoms() if a.GetIsAromatic())
    return [Crippen.MolLogP(mol), Descriptors.MolWt(mol), float(Lipinski.NumRotatableBonds(mol)),
            aromatic / heavy if heavy else 0.0]


def molecule_element_fractions(smiles, elements=FRACTION_ELEMENTS):
    """Atom fractions (hydrogens included) of a molecule over ``elements``, like
    ``element_fractions`` for a formula.  Needs RDKit."""
    Chem = import_rdkit()
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"invalid SMILES {smiles!r}: RDKit cannot parse it")
    counts = Counter()
    for atom in mol.GetAtoms():
        counts[atom.GetSymbol()] += 1
        counts["H"] += atom.GetTotalNumHs()
    formula = "".join(f"{e}{n}" for e, n in counts.items() if n)
    return element_fractions(formula, elements)


def formula_reordered(formula, order):
    """``formula`` (no brackets) with its element-amount pairs in the order ``order`` (a permutation
    of range(number of elements)): ``formula_reordered("Ca1F6Ti1", [2, 0, 1]) == "Ti1Ca1F6"``.
    The composition is unchanged; only the order of the text differs."""
    pairs = ELEMENT_AMOUNT.findall(formula)
    if not SIMPLE_FORMULA.fullmatch(formula) or not pairs:
        raise ValueError(f"formula_reordered needs a formula without brackets, got {formula!r}")
    if sorted(order) != list(range(len(pairs))):
        raise ValueError(f"order {order!r} is not a permutation of the {len(pairs)} elements of {formula!r}")
    return "".join(pairs[i][0] + pairs[i][1] for i in order)


def formula_orders(formula, k, rng):
    """Up to ``k`` distinct rewrites of ``formula`` in element orders other than its own (all of them
    when there are fewer), drawn with ``rng``; [] for a one-element formula."""
    n = len(ELEMENT_AMOUNT.findall(formula))
    n_other = math.factorial(n) - 1
    if n_other == 0:
        return []
    if n_other <= k:
        return [formula_reordered(formula, list(p)) for p in itertools.permutations(range(n))][1:]
    seen, out = {tuple(range(n))}, []
    while len(out) < k:
        order = list(range(n))
        rng.shuffle(order)
        if tuple(order) not in seen:
            seen.add(tuple(order))
            out.append(formula_reordered(formula, order))
    return out


# =====================================================================================
# 2. Element features: periodic-table priors for formula models (experiment 7)
# =====================================================================================

ELEMENT_FEATURE_NAMES = ("atomic_number", "period", "group", "f_block", "atomic_weight", "covalent_radius",
                         "vdw_radius", "outer_electrons")
ELEMENT_FEATURE_SOURCE = ("RDKit's periodic table (Chem.GetPeriodicTable: atomic number, weight, covalent and "
                          "van der Waals radii, outer-shell electrons); period, group and f-block computed "
                          "from the atomic number (f-block elements in group 3)")


def _period_group(z):
    """(period, group 1-18, f_block) of atomic number z; lanthanides and actinides sit in group 3."""
    ends = (2, 10, 18, 36, 54, 86, 118)
    if not 1 <= z <= 118:
        raise ValueError(f"_period_group: atomic number {z!r} outside 1..118")
    period = next(i + 1 for i, e in enumerate(ends) if z <= e)
    pos = z - ((0,) + ends)[period - 1]                      # 1-based place in its period
    if period == 1:
        return 1, (1 if z == 1 else 18), 0
    if period <= 3:
        return period, (pos if pos <= 2 else pos + 10), 0
    if period <= 5:
        return period, pos, 0
    if pos <= 2:
        return period, pos, 0
    return (period, 3, 1) if pos <= 17 else (period, pos - 14, 0)


def element_features(symbols, standardize=True):
    """{symbol: [features]} for element symbols, in ELEMENT_FEATURE_NAMES order (source:
    ELEMENT_FEATURE_SOURCE): the periodic-table priors the tutorial's §9 proposes for composition models.
    With ``standardize`` every feature is z-scored over the given symbols, so a learned projection starts on a
    sensible scale.  An unknown symbol raises ValueError naming it."""
    Chem = import_rdkit()
    pt = Chem.GetPeriodicTable()
    raw = {}
    for sym in symbols:
        try:
            z = pt.GetAtomicNumber(sym)
        except RuntimeError:
            z = 0
        if z <= 0:
            raise ValueError(f"element_features: {sym!r} is not an element symbol")
        period, group, f_block = _period_group(z)
        raw[sym] = [float(z), float(period), float(group), float(f_block), pt.GetAtomicWeight(sym),
                    pt.GetRcovalent(sym), pt.GetRvdw(sym), float(pt.GetNOuterElecs(sym))]
    if not standardize or len(raw) < 2:
        return raw
    cols = list(zip(*raw.values()))
    stats = []
    for c in cols:
        mu = sum(c) / len(c)
        sd = (sum((v - mu) ** 2 for v in c) / len(c)) ** 0.5
        stats.append((mu, sd if sd > 0 else 1.0))
    return {sym: [(v - mu) / sd for v, (mu, sd) in zip(vals, stats)] for sym, vals in raw.items()}


def token_feature_matrix(vocab, symbols_features):
    """Rows of fixed features per vocabulary id (for ``TransformerEncoder(token_features=...)``): an element
    token gets its features, every other token (counts, specials) a row of zeros."""
    k = len(next(iter(symbols_features.values())))
    return [list(symbols_features.get(tok, [0.0] * k)) for tok in vocab.itos]        # one row per id
