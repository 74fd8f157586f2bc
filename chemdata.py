"""Chemistry data for the Transformer experiments: tokenizers, offline-first
dataset loaders, splits, featurizers, baselines and metrics.

Like ``transformer.py`` this module imports only the Python standard library
at module level.  RDKit is imported lazily inside the few functions that need
it (canonical SMILES, scaffolds, fingerprints); without it those functions
raise an ImportError that says which extra to install
(``pip install -e ".[chem]"``).  Nothing here uses numpy: data come back as
plain lists of strings and floats.

The module reads top to bottom in the tutorial's order:

    1. errors, optional packages   DatasetNotFoundError, ChecksumError, DatasetFormatError;
                                   rdkit_available (RDKit imported lazily)
    2. SMILES tokenizers           tokenize_smiles (atom level), tokenize_chars
    3. chemical formulas           tokenize_formula, parse_formula, reduced_formula, element_fractions
    4. vocabulary                  Vocab
    5. data files                  data_dir, data_path (offline first: download only when a file is
                                   missing), DATA_FILES (URL and sha256 of every file),
                                   check_data_files, build_uspto50k_csv
    6. loaders                     load_esol, load_hopv, load_mp_formation_energy, load_uspto50k;
                                   strip_atom_maps, split_reaction, filter_reactions
    7. splits                      random_split, scaffold_split, group_split, murcko_scaffold
    8. chemistry helpers           canonical_smiles, is_valid_smiles, duplicate_report,
                                   morgan_fingerprints, tanimoto
    9. metrics                     rmse, mae, r2, pearson, paired_bootstrap, ZScore
   10. baselines                   ridge_fit, ridge_predict, mean_baseline
   11. experiments 4-5             SmilesConstraint (grammar + valence masks for generate), SmilesGrammarError
   12. experiments 4-5             smiles_failure_reason, FAILURE_REASONS; SELFIES: smiles_to_selfies,
                                   selfies_to_smiles, tokenize_selfies
  12b. experiment 4               NgramLM, fit_ngram, ngram_bits_per_token (the n-gram baseline);
                                   tutorial_novelty; distribution_metrics: guacamol_kl_score, fcd_score
                                   (guacamol, fcd imported lazily), moses_metrics, length_histogram
   13. experiments 6-8             randomized_smiles, esol_descriptors, molecule_element_fractions,
                                   formula_reordered, formula_orders
   14. experiment 7                element_features, token_feature_matrix
   15. experiments 6-8             load_predictor / Predictor (a saved model on new SMILES or formulas,
                                   with a status per input), predict_csv
   16. experiment 9                canonical_match, heavy_atom_counts, atoms_conserved, reactants_by_size,
                                   copy_largest_reactant, NearestReactionBaseline, product_tanimoto,
                                   score_prediction, random_spelling
   16b. experiment 5               closing_partners (the ring / branch partner of each closing token)
   17. command line                python chemdata.py fetch | check | predict (main)

Data folder
-----------
Files are looked up in ``$CHEMDATA_DIR`` if that is set, otherwise in
``data/`` next to this file.  A missing file is downloaded from the URL in
``DATA_FILES`` (checked against its sha256 and written atomically) unless
``CHEMDATA_OFFLINE=1`` is set or the loader is called with
``download=False``; then a ``DatasetNotFoundError`` names the file, the URL
and the folder to put it in.  ``data/README.md`` gives the provenance.
"""

import contextlib
import csv
import hashlib
import io
import itertools
import json
import math
import os
import random
import re
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import NamedTuple

from safe_io import atomic_write

CHEM_EXTRA_HINT = 'pip install -e ".[chem]"'


# =====================================================================================
# 1. Errors and the optional chemistry packages (imported lazily)
# =====================================================================================

class DatasetNotFoundError(FileNotFoundError):
    """A data file is missing and could not be downloaded.

    Attributes: ``filename`` (the file's name), ``url`` (where to get it),
    ``folder`` (where to put it) and ``reason`` (why it was not downloaded).
    """

    def __init__(self, filename, url, folder, reason):
        self.filename = filename
        self.url = url
        self.folder = folder
        self.reason = reason
        base, download = os.path.basename(filename), os.path.basename(url.rstrip("/"))
        what = (f"it ({download} as downloaded, or the {base} inside it)" if download != base and
                download.endswith(".tar.gz") else "it")
        message = (
            f"data file {base!r} is not in {folder} and {reason}. "
            f"Download it from {url} and put {what} in {folder} "
            f"(or set CHEMDATA_DIR to a data folder that holds it as {filename}).")
        super().__init__(message)
        self.message = message

    def __str__(self):
        return self.message


class ChecksumError(ValueError):
    """A downloaded (or checked) file does not have the sha256 the manifest expects."""


class DatasetFormatError(ValueError):
    """A data file does not have the columns or values a loader expects."""


def _import_rdkit():
    """Return the ``rdkit.Chem`` module or raise an ImportError naming the extra."""
    try:
        from rdkit import Chem
    except ImportError:
        raise ImportError(f"this function needs RDKit, which is not installed: "
                          f"{CHEM_EXTRA_HINT}") from None
    return Chem


def rdkit_available():
    """True if RDKit can be imported (the ``chem`` extra is installed)."""
    try:
        _import_rdkit()
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _quiet_rdkit():
    """Silence RDKit's logger (parse warnings) inside a ``with`` block."""
    from rdkit import rdBase
    blocker = rdBase.BlockLogs()
    try:
        yield
    finally:
        del blocker


# =====================================================================================
# 2. SMILES tokenizers
# =====================================================================================

# One token per: bracket atom ([nH], [C@@H], [N+], [O-], [2H], [Si], [CH3:1]),
# two-letter organic-subset halogens (Br, Cl), the reaction arrow '>>',
# two-digit ring closures (%12), one-letter organic-subset atoms (aliphatic
# and aromatic), the wildcard atom '*', ring-closure digits, bonds
# (- = # $ : / \), branches ( ), the dot and the single '>' of
# 'reactants>reagents>products'.
_SMILES_TOKEN = re.compile(
    r"\[[0-9]*[A-Za-z*][A-Za-z0-9@+\-:]*\]"   # bracket atom
    r"|Br|Cl|>>|%[0-9]{2}"
    r"|[BCNOPSFI]|[bcnops]|\*"
    r"|[0-9]"
    r"|[-=#$:/\\().>]")


def tokenize_smiles(smiles):
    """Split a SMILES (or reaction SMILES) string into atom-level tokens.

    Bracket atoms, Cl, Br, ``%nn`` ring closures and ``>>`` are single tokens;
    every other token is one character.  ``"".join(tokenize_smiles(s)) == s``
    holds for every string it accepts.  A character that fits no token
    (a space, a lower-case 'l' on its own, an unclosed '[') raises
    ValueError naming the character and its position.

    >>> tokenize_smiles("c1ccc2[nH]ccc2c1Cl")
    ['c', '1', 'c', 'c', 'c', '2', '[nH]', 'c', 'c', 'c', '2', 'c', '1', 'Cl']
    """
    tokens = _SMILES_TOKEN.findall(smiles)
    if "".join(tokens) != smiles:
        position = 0
        while True:   # find the first character no token starts at
            match = _SMILES_TOKEN.match(smiles, position)
            if match is None:
                break
            position = match.end()
        raise ValueError(f"cannot tokenize character {smiles[position]!r} at position "
                         f"{position} of SMILES {smiles!r}")
    return tokens


def tokenize_chars(smiles):
    """Character-level baseline tokenizer: one token per character."""
    return list(smiles)


# =====================================================================================
# 3. Chemical formulas
# =====================================================================================

ELEMENTS = (
    "H", "He", "Li", "Be", "B", "C", "N", "O", "F", "Ne",
    "Na", "Mg", "Al", "Si", "P", "S", "Cl", "Ar", "K", "Ca",
    "Sc", "Ti", "V", "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn",
    "Ga", "Ge", "As", "Se", "Br", "Kr", "Rb", "Sr", "Y", "Zr",
    "Nb", "Mo", "Tc", "Ru", "Rh", "Pd", "Ag", "Cd", "In", "Sn",
    "Sb", "Te", "I", "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd",
    "Pm", "Sm", "Eu", "Gd", "Tb", "Dy", "Ho", "Er", "Tm", "Yb",
    "Lu", "Hf", "Ta", "W", "Re", "Os", "Ir", "Pt", "Au", "Hg",
    "Tl", "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac", "Th",
    "Pa", "U", "Np", "Pu", "Am", "Cm", "Bk", "Cf", "Es", "Fm",
    "Md", "No", "Lr", "Rf", "Db", "Sg", "Bh", "Hs", "Mt", "Ds",
    "Rg", "Cn", "Nh", "Fl", "Mc", "Lv", "Ts", "Og")
"""All 118 element symbols in periodic-table order (``ELEMENTS[z - 1]``)."""

FRACTION_ELEMENTS = ELEMENTS[:83] + ("Ac", "Th", "Pa", "U", "Np", "Pu")
"""The 89 elements of ``element_fractions`` vectors, in periodic-table order:
H to Bi (Z = 1..83) plus the actinides Ac, Th, Pa, U, Np, Pu that occur in
``mp_e_form.csv``.  The data use 84 of them (no noble gases, no Po/At/Rn/Fr/Ra)."""

_ELEMENT_SET = frozenset(ELEMENTS)
_FORMULA_TOKEN = re.compile(r"[A-Z][a-z]?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+|[()\[\]]")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
_ELEMENT_AMOUNT = re.compile(r"([A-Z][a-z]?)([0-9]+(?:\.[0-9]+)?|\.[0-9]+)?")
_SIMPLE_FORMULA = re.compile(r"(?:[A-Z][a-z]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)?)+")


def tokenize_formula(formula):
    """Split a chemical formula into element symbols, amounts and brackets.

    Amounts are whole numbers such as ``"12"`` or ``"0.5"``.  An unknown
    element symbol or a character that fits no token raises ValueError.

    >>> tokenize_formula("Mg2Si")
    ['Mg', '2', 'Si']
    """
    tokens = _FORMULA_TOKEN.findall(formula)
    if "".join(tokens) != formula:
        position = 0
        while True:   # find the first character no token starts at
            match = _FORMULA_TOKEN.match(formula, position)
            if match is None:
                break
            position = match.end()
        raise ValueError(f"cannot tokenize character {formula[position]!r} at position "
                         f"{position} of formula {formula!r}")
    for token in tokens:
        if token[0].isalpha() and token not in _ELEMENT_SET:
            raise ValueError(f"unknown element symbol {token!r} in formula {formula!r}")
    return tokens


def _parse_formula_exact(formula):
    """Parse a formula into {element: int or Fraction}, in order of first appearance."""
    if _SIMPLE_FORMULA.fullmatch(formula):       # fast path: no brackets, e.g. Ca1F6Ti1
        composition = {}
        for element, text in _ELEMENT_AMOUNT.findall(formula):
            if element not in _ELEMENT_SET:
                raise ValueError(f"unknown element symbol {element!r} in formula {formula!r}")
            amount = 1 if not text else int(text) if text.isdigit() else Fraction(text)
            if amount <= 0:
                raise ValueError(f"amount {text!r} in formula {formula!r} is not positive")
            composition[element] = composition.get(element, 0) + amount
        return composition
    tokens = tokenize_formula(formula)
    if not tokens:
        raise ValueError(f"empty formula {formula!r}")
    stack = [{}]            # one composition per open bracket
    opened = []             # the bracket characters still open
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token in ("(", "["):
            stack.append({})
            opened.append(token)
            continue
        if _NUMBER.fullmatch(token):
            raise ValueError(f"amount {token!r} in formula {formula!r} does not follow "
                             f"an element or a closing bracket")
        amount = 1
        if i < len(tokens) and _NUMBER.fullmatch(tokens[i]):
            text = tokens[i]
            amount = int(text) if text.isdigit() else Fraction(text)   # exact, no rounding
            if amount <= 0:
                raise ValueError(f"amount {tokens[i]!r} in formula {formula!r} is not positive")
            i += 1
        if token in (")", "]"):
            if not opened or opened.pop() + token not in ("()", "[]"):
                raise ValueError(f"unbalanced {token!r} in formula {formula!r}")
            group = stack.pop()
            for element, count in group.items():
                stack[-1][element] = stack[-1].get(element, 0) + count * amount
        else:
            stack[-1][token] = stack[-1].get(token, 0) + amount
    if opened:
        raise ValueError(f"unclosed {opened[-1]!r} in formula {formula!r}")
    return stack[0]


def parse_formula(formula):
    """Parse a formula into ``{element: amount}`` (floats, order of first appearance).

    Accepts explicit ones (``C1Pt1``), decimals (``Fe0.5Ni0.5``) and nested
    brackets (``Ca3(PO4)2``); repeated elements are added up.  Unknown
    element symbols, unbalanced brackets and zero amounts raise ValueError.

    >>> parse_formula("Ca3(PO4)2")
    {'Ca': 3.0, 'P': 2.0, 'O': 8.0}
    """
    return {element: float(amount) for element, amount in _parse_formula_exact(formula).items()}


def reduced_formula(formula):
    """The reduced formula in a fixed order: elements sorted alphabetically,
    amounts divided by their greatest common divisor, amounts of 1 omitted.

    Decimal amounts are made whole first, exactly: ``Fe0.5Ni0.5`` -> ``FeNi``,
    ``Ca1F6Ti1`` and ``Ca2F12Ti2`` -> ``CaF6Ti``.
    """
    composition = _parse_formula_exact(formula)
    if not all(isinstance(amount, int) for amount in composition.values()):
        scale = math.lcm(*(amount.denominator for amount in composition.values()))
        composition = {element: int(amount * scale) for element, amount in composition.items()}
    divisor = math.gcd(*composition.values())
    parts = []
    for element in sorted(composition):
        count = composition[element] // divisor
        parts.append(element if count == 1 else f"{element}{count}")
    return "".join(parts)


_ELEMENT_POSITIONS = {}   # element list -> {symbol: column}, filled on first use


def element_fractions(formula, elements=FRACTION_ELEMENTS):
    """Atom fractions of ``formula`` as a list over ``elements`` (sums to 1).

    By default the vector has ``len(FRACTION_ELEMENTS) == 89`` entries
    (H..Bi plus Ac, Th, Pa, U, Np, Pu).  An element of the formula that is
    not in ``elements`` raises ValueError.
    """
    composition = parse_formula(formula)
    total = sum(composition.values())
    elements = tuple(elements)
    position = _ELEMENT_POSITIONS.get(elements)
    if position is None:
        position = _ELEMENT_POSITIONS[elements] = {e: i for i, e in enumerate(elements)}
    vector = [0.0] * len(elements)
    for element, amount in composition.items():
        if element not in position:
            raise ValueError(f"element {element!r} of formula {formula!r} is not in the "
                             f"element list ({len(elements)} elements)")
        vector[position[element]] = amount / total
    return vector


# =====================================================================================
# 4. Vocabulary
# =====================================================================================

class Vocab:
    """A token <-> id table with fixed special tokens.

    Ids 0..3 are always ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; the
    ordinary tokens follow.  ``Vocab.build`` orders them by descending
    frequency in the training data, ties broken alphabetically, so the same
    data always give the same ids.  ``encode`` maps unknown tokens to
    ``<unk>`` and counts them in ``unk_count`` (and, per token, in
    ``unknown_tokens``).
    """

    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

    def __init__(self, tokens):
        """Make a vocabulary from ordinary ``tokens`` (no specials), in id order."""
        self.itos = list(self.SPECIALS)
        for token in tokens:
            if token in self.SPECIALS:
                raise ValueError(f"token {token!r} is a special token and cannot be added")
            self.itos.append(token)
        self.stoi = {token: i for i, token in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            duplicates = [t for t, n in Counter(self.itos).items() if n > 1]
            raise ValueError(f"duplicate tokens {duplicates[:5]!r} in vocabulary")
        self.counts = {}               # training frequencies, filled by build()
        self.unk_count = 0
        self.unknown_tokens = Counter()

    @classmethod
    def build(cls, token_lists, min_freq=1):
        """Build a vocabulary from training token lists (keep tokens seen >= min_freq times)."""
        counts = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        kept = [t for t, n in counts.items() if n >= min_freq and t not in cls.SPECIALS]
        kept.sort(key=lambda t: (-counts[t], t))
        vocab = cls(kept)
        vocab.counts = {t: counts[t] for t in kept}
        return vocab

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3   # the ids of SPECIALS

    def __len__(self):
        """Number of ids, specials included."""
        return len(self.itos)

    def __contains__(self, token):
        """True if ``token`` has its own id."""
        return token in self.stoi

    @property
    def tokens(self):
        """The ordinary tokens (no specials) in id order."""
        return self.itos[len(self.SPECIALS):]

    def encode(self, tokens, add_bos_eos=True):
        """Token list -> id list, with <bos>/<eos> around it if ``add_bos_eos``."""
        ids = [self.bos_id] if add_bos_eos else []
        for token in tokens:
            i = self.stoi.get(token)
            if i is None:
                i = self.unk_id
                self.unk_count += 1
                self.unknown_tokens[token] += 1
            ids.append(i)
        if add_bos_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, strip_special=True):
        """Id list -> token list; ``strip_special`` drops <pad>, <bos> and <eos>
        (``<unk>`` is kept so that lost tokens stay visible)."""
        tokens = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.itos):
                raise ValueError(f"id {i} is outside the vocabulary (size {len(self.itos)})")
            if strip_special and i in (self.pad_id, self.bos_id, self.eos_id):
                continue
            tokens.append(self.itos[i])
        return tokens

    def to_json(self):
        """The vocabulary as a JSON string (all tokens in id order)."""
        return json.dumps({"format": "chemdata.Vocab", "version": 1, "itos": self.itos},
                          ensure_ascii=False)

    @classmethod
    def from_json(cls, text):
        """Rebuild a vocabulary from ``to_json`` output."""
        data = json.loads(text)
        itos = data.get("itos") if isinstance(data, dict) else None
        if not isinstance(itos, list) or tuple(itos[:len(cls.SPECIALS)]) != cls.SPECIALS:
            raise ValueError("not a chemdata.Vocab JSON: expected 'itos' starting with "
                             f"{list(cls.SPECIALS)}")
        return cls(itos[len(cls.SPECIALS):])

    def save(self, path):
        """Write ``to_json()`` to ``path`` atomically."""
        atomic_write(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path):
        """Read a vocabulary written by ``save``."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def __repr__(self):
        return f"Vocab({len(self)} ids: 4 specials + {len(self) - 4} tokens)"


# =====================================================================================
# 5. Data files: where they are, where they come from, and their checksums
# =====================================================================================

_S3 = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/"
_LIU_BASE = ("https://raw.githubusercontent.com/pandegroup/reaction_prediction_seq2seq/"
             "bf58e93be7b25924e6cd50ede7ed9ddf582d8372/processed_data/")
_LIU_DIR = "uspto50k_liu2017_original"
_LIU_PARTS = ("train", "valid", "test")

DATA_FILES = {
    "delaney-processed.csv": {
        "url": _S3 + "delaney-processed.csv", "bytes": 96_699,
        "sha256": "8c06a76f0c6487d29ab0f903e6a7a7139f189ab3c1178f159c8be8964602f189"},
    "hopv.csv": {
        # DeepChem ships hopv.csv inside hopv.tar.gz; the sha256 is that of hopv.csv.
        "url": _S3 + "hopv.tar.gz", "archive_member": "hopv.csv", "bytes": 65_267,
        "sha256": "9b7ae265cd868839d741fb4bdbb7ccd7eb1542e10b3435c7f08aaaf7acd0ca8e"},
    "mp_e_form.csv": {
        # Matbench's matbench_mp_e_form as a composition-only CSV, from CrabNet.
        "url": ("https://raw.githubusercontent.com/anthony-wang/CrabNet/"
                "457b4d4835737ecbe4dd33e53174bd818bd82143/data/matbench/mp_e_form.csv"),
        "bytes": 4_022_461,
        "sha256": "90e895635c96447c5be4e9070d26f26e1b4d17925102a6597ae3c4d79c32555b"},
    "USPTO_50K.csv": {
        # Built by build_uspto50k_csv from the six Liu et al. 2017 files below.
        "url": _LIU_BASE, "built_from": _LIU_DIR, "bytes": 5_369_947,
        "sha256": "08a27014df4853982408c2ffa998ab22b25b4ac3ca81d21cddcac5a2b5a6259b"},
    _LIU_DIR + "/train_sources": {
        "url": _LIU_BASE + "train_sources", "bytes": 3_936_472,
        "sha256": "a09a5700f1fe3f91aea33d122eda870bd1d99ad2ec0fd81fa37f43b0e2871747"},
    _LIU_DIR + "/train_targets": {
        "url": _LIU_BASE + "train_targets", "bytes": 4_058_658,
        "sha256": "af8fb61d23357618d45a2009020e5354d0325e96d6d3f5b1d9ffd781b6a147ca"},
    _LIU_DIR + "/valid_sources": {
        "url": _LIU_BASE + "valid_sources", "bytes": 494_411,
        "sha256": "40459c9e5c0f63c1ca08a8ebda2cc80bde42f5dbf0d520cd6c9f9069ae694f48"},
    _LIU_DIR + "/valid_targets": {
        "url": _LIU_BASE + "valid_targets", "bytes": 508_692,
        "sha256": "b856e45c5b762e416fbe93e75432c5cc4d3ee0dd90582d8b4c0d9cacaf3a6dee"},
    _LIU_DIR + "/test_sources": {
        "url": _LIU_BASE + "test_sources", "bytes": 492_255,
        "sha256": "dd10431c929eb9f7fe8952d263c1fed118b8fb4c6e8f8004b73c528adf1989c9"},
    _LIU_DIR + "/test_targets": {
        "url": _LIU_BASE + "test_targets", "bytes": 508_588,
        "sha256": "408504846efaafcfc2c0559a507a40232dcf3393fb7263aa83f583ececbd8179"},
}
"""Every data file: its canonical ``url``, size in ``bytes`` and ``sha256``.

``delaney-processed.csv`` and ``hopv.tar.gz`` are the DeepChem URLs.
``mp_e_form.csv`` comes from CrabNet's copy of Matbench at a fixed commit.
``USPTO_50K.csv`` is *not* DeepChem's file of that name (which holds the
GLN split of Dai et al.): it is rebuilt from Liu et al. 2017's files at a
fixed commit, so that the row counts and split are those of the offline copy.
"""


def data_dir():
    """The data folder: ``$CHEMDATA_DIR`` if set, else ``data/`` beside this file."""
    folder = os.environ.get("CHEMDATA_DIR")
    if folder:
        return os.path.abspath(folder)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def downloads_enabled(download=None):
    """Whether a missing file may be downloaded: ``download`` if given,
    otherwise True unless the environment sets ``CHEMDATA_OFFLINE=1``."""
    if download is not None:
        return bool(download)
    return os.environ.get("CHEMDATA_OFFLINE", "").strip().lower() not in ("1", "true", "yes")


def sha256_of(path):
    """The sha256 hex digest of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_data_files():
    """Compare the files present in the data folder with ``DATA_FILES``.

    Returns ``{name: "ok" | "missing" | "sha256 mismatch"}``.
    """
    report = {}
    for name, entry in DATA_FILES.items():
        path = os.path.join(data_dir(), name)
        if not os.path.exists(path):
            report[name] = "missing"
        else:
            report[name] = "ok" if sha256_of(path) == entry["sha256"] else "sha256 mismatch"
    return report


def _fetch_url(url):
    """Download ``url`` into memory, printing a progress line on stderr.

    Network errors come back as ``OSError`` (urllib's URLError is one).
    Tests replace this function to simulate downloads.
    """
    import urllib.request
    with urllib.request.urlopen(url, timeout=60) as response:
        total = int(response.headers.get("Content-Length") or 0)
        chunks, got = [], 0
        while True:
            chunk = response.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            size = f"{got / 1e6:.1f} of {total / 1e6:.1f} MB" if total else f"{got / 1e6:.1f} MB"
            print(f"\rdownloading {url}: {size}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    return b"".join(chunks)


def _download_verified(name, folder):
    """Download data file ``name``, check its sha256, return its bytes."""
    entry = DATA_FILES[name]
    try:
        data = _fetch_url(entry["url"])
    except (OSError, ValueError) as exc:   # URLError, timeouts, refused connections
        raise DatasetNotFoundError(name, entry["url"], _file_folder(folder, name),
                                   f"the download failed ({exc})") from None
    if "archive_member" in entry:
        data = _member_of_targz(data, entry["archive_member"], entry["url"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise ChecksumError(f"{name} downloaded from {entry['url']} has sha256 {digest}, "
                            f"expected {entry['sha256']}; it was not saved. If the upstream "
                            f"file changed on purpose, check it and update chemdata.DATA_FILES.")
    return data


def _member_of_targz(data, member_name, url):
    """Return the bytes of the file called ``member_name`` inside a .tar.gz."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                if member.isfile() and os.path.basename(member.name) == member_name:
                    return archive.extractfile(member).read()
    except tarfile.TarError as exc:
        raise DatasetFormatError(f"{url} is not a readable .tar.gz archive ({exc})") from None
    raise DatasetFormatError(f"{url} holds no file called {member_name!r}")


def _file_folder(folder, name):
    """The folder data file ``name`` goes in: the data folder, or its subfolder for 'subfolder/file'."""
    return os.path.dirname(os.path.join(folder, name))


def _from_local_archive(name, folder):
    """When ``name`` ships inside a .tar.gz (hopv.csv in hopv.tar.gz) and that archive, as downloaded, is in
    the data folder: write the member beside it (sha256-checked, atomically) and return its path; else None."""
    entry = DATA_FILES[name]
    archive = os.path.join(_file_folder(folder, name), os.path.basename(entry.get("url", "")))
    if "archive_member" not in entry or not os.path.isfile(archive):
        return None
    with open(archive, "rb") as f:
        data = _member_of_targz(f.read(), entry["archive_member"], archive)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise ChecksumError(f"{entry['archive_member']} inside {archive} has sha256 {digest}, "
                            f"expected {entry['sha256']}; it was not extracted")
    path = os.path.join(folder, name)
    atomic_write(path, data)
    return path


def data_path(name, download=None):
    """Path of data file ``name`` in ``data_dir()``, downloading it if missing.

    ``download=None`` follows ``CHEMDATA_OFFLINE``; ``download=False`` never
    touches the network.  A file that is neither present nor downloadable
    raises ``DatasetNotFoundError`` naming the file, its URL and the folder it
    belongs in (a sub-folder for the Liu et al. files).  ``hopv.csv`` is also
    taken from DeepChem's ``hopv.tar.gz`` when that archive lies in the folder.
    ``USPTO_50K.csv`` is built from the Liu et al. files (downloaded if needed).
    """
    if name not in DATA_FILES:
        raise KeyError(f"unknown data file {name!r}; known: {sorted(DATA_FILES)}")
    folder = data_dir()
    path = os.path.join(folder, name)
    if os.path.exists(path):
        return path
    if _from_local_archive(name, folder):
        return path
    entry = DATA_FILES[name]
    if "built_from" in entry:
        sources_missing = [p for p in _liu_files() if not os.path.exists(os.path.join(folder, p))]
        if sources_missing and not downloads_enabled(download):
            raise DatasetNotFoundError(
                name, entry["url"], folder,
                "downloads are disabled (CHEMDATA_OFFLINE=1 or download=False); it can also be "
                f"rebuilt from the six Liu et al. files ({', '.join(_liu_files())}) "
                f"found at that URL")
        for source in sources_missing:
            data_path(source, download)
        build_uspto50k_csv(os.path.join(folder, entry["built_from"]), path)
        return path
    if not downloads_enabled(download):
        raise DatasetNotFoundError(name, entry["url"], _file_folder(folder, name),
                                   "downloads are disabled (CHEMDATA_OFFLINE=1 or download=False)")
    atomic_write(path, _download_verified(name, folder))
    return path


def _liu_files():
    """Names of the six Liu et al. 2017 files, relative to the data folder."""
    return [f"{_LIU_DIR}/{part}_{kind}" for part in _LIU_PARTS for kind in ("sources", "targets")]


def build_uspto50k_csv(source_dir, dest_path):
    """Write ``USPTO_50K.csv`` (columns ``reactions,class,split``) from the
    Liu et al. 2017 files ``{train,valid,test}_{sources,targets}`` in ``source_dir``.

    Each ``*_sources`` line is ``<RX_k>`` then the product SMILES, one
    character per space-separated token; the aligned ``*_targets`` line
    holds the reactants.  The reaction is ``reactants>>product``, ``class``
    is k and ``split`` the file's part; order is train, valid, test.  The
    result is checked against the sha256 in ``DATA_FILES``.
    """
    lines = ["reactions,class,split"]
    for part in _LIU_PARTS:
        with open(os.path.join(source_dir, f"{part}_sources"), encoding="utf-8") as f:
            sources = f.read().splitlines()
        with open(os.path.join(source_dir, f"{part}_targets"), encoding="utf-8") as f:
            targets = f.read().splitlines()
        if len(sources) != len(targets):
            raise DatasetFormatError(f"{part}_sources has {len(sources)} lines but "
                                     f"{part}_targets has {len(targets)}")
        for number, (source, target) in enumerate(zip(sources, targets), start=1):
            source_tokens = source.split(" ")
            match = re.fullmatch(r"<RX_(\d+)>", source_tokens[0])
            if match is None:
                raise DatasetFormatError(f"{part}_sources line {number} does not start with "
                                         f"<RX_k>: {source[:40]!r}")
            product_tokens, reactant_tokens = source_tokens[1:], target.split(" ")
            for token in product_tokens + reactant_tokens:
                if len(token) != 1:
                    raise DatasetFormatError(f"{part} line {number}: token {token!r} is not "
                                             f"a single character")
            product, reactants = "".join(product_tokens), "".join(reactant_tokens)
            lines.append(f"{reactants}>>{product},{match.group(1)},{part}")
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    expected = DATA_FILES["USPTO_50K.csv"]["sha256"]
    if digest != expected:
        raise ChecksumError(f"USPTO_50K.csv built from {source_dir} has sha256 {digest}, "
                            f"expected {expected}; it was not saved")
    atomic_write(dest_path, text)
    return dest_path


# =====================================================================================
# 6. Loaders
# =====================================================================================

@dataclass
class MoleculeDataset:
    """Molecules and one regression target: ``smiles[i]`` has value ``y[i]``.

    ``info`` records what the loader read and dropped (row counts, ...).
    """
    smiles: list
    y: list
    task: str
    source_file: str
    info: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.smiles)


@dataclass
class FormulaDataset:
    """Compositions (formula strings) and one target: ``formulas[i]`` has value ``y[i]``."""
    formulas: list
    y: list
    task: str
    source_file: str
    info: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.formulas)


@dataclass
class ReactionDataset:
    """Reaction SMILES ``reactants>>product`` with their reaction ``classes``
    (int, or None when the file has none) and the file's own ``splits``
    ('train'/'valid'/'test', or None)."""
    reactions: list
    classes: list
    splits: list
    source_file: str
    info: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.reactions)


def _read_columns(path, required, optional=()):
    """Read a CSV file into ``{column: list of strings}``.

    Missing ``required`` columns and rows with the wrong number of fields
    raise DatasetFormatError; ``optional`` columns that are absent map to None.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        rows = list(reader)
    for column in required:
        if column not in header:
            raise DatasetFormatError(f"{path} has no column {column!r} (its columns: {header})")
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DatasetFormatError(f"{path} line {number} has {len(row)} fields, "
                                     f"the header has {len(header)}")
    columns = {}
    for column in list(required) + list(optional):
        if column in header:
            i = header.index(column)
            columns[column] = [row[i] for row in rows]
        else:
            columns[column] = None
    return columns


def _finite(values):
    """Keep the finite numbers among ``values`` (strings or numbers).

    Empty strings, None, NaN and +/-inf are dropped; text that is not a
    number raises DatasetFormatError.  Returns ``(kept_indices,
    kept_values, n_dropped)``.
    """
    indices, kept = [], []
    for i, value in enumerate(values):
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise DatasetFormatError(f"row {i}: value {value!r} is not a number") from None
        if math.isfinite(number):
            indices.append(i)
            kept.append(number)
    return indices, kept, len(values) - len(indices)


ESOL_TASK = "measured log solubility in mols per litre"


def load_esol(download=None):
    """ESOL (Delaney 2004): 1128 molecules and their measured log solubility (log mol/L).

    Reads ``delaney-processed.csv`` (columns ``smiles`` and
    ``measured log solubility in mols per litre``) and strips the trailing
    spaces of 212 SMILES (counted in ``info["n_stripped"]``).
    """
    path = data_path("delaney-processed.csv", download)
    columns = _read_columns(path, ["smiles", ESOL_TASK])
    smiles = [s.strip() for s in columns["smiles"]]
    n_stripped = sum(1 for raw, s in zip(columns["smiles"], smiles) if raw != s)
    indices, y, n_dropped = _finite(columns[ESOL_TASK])
    return MoleculeDataset(smiles=[smiles[i] for i in indices], y=y, task=ESOL_TASK,
                           source_file=path,
                           info={"n_rows": len(smiles), "n_dropped": n_dropped,
                                 "n_stripped": n_stripped, "units": "log10(mol/L)"})


HOPV_TASKS = ("HOMO", "LUMO", "electrochemical_gap", "optical_gap",
              "PCE", "V_OC", "J_SC", "fill_factor")


def load_hopv(task="electrochemical_gap", download=None, verbose=False):
    """HOPV15 organic photovoltaics (Lopez et al. 2016): molecules and one of ``HOPV_TASKS``.

    Reads ``hopv.csv`` (350 rows, DeepChem's format).  Rows whose target is
    empty, NaN or infinite are dropped and counted in ``info["n_dropped"]``
    (117 of 350 for electrochemical_gap, leaving 233).  HOMO, LUMO and the
    gaps are in eV.
    """
    if task not in HOPV_TASKS:
        raise ValueError(f"unknown HOPV task {task!r}; choose one of {HOPV_TASKS}")
    path = data_path("hopv.csv", download)
    columns = _read_columns(path, ["smiles", task])
    indices, y, n_dropped = _finite(columns[task])
    n_rows = len(columns["smiles"])
    if verbose:
        print(f"hopv.csv: dropped {n_dropped} of {n_rows} rows without a finite {task}")
    return MoleculeDataset(smiles=[columns["smiles"][i].strip() for i in indices], y=y,
                           task=task, source_file=path,
                           info={"n_rows": n_rows, "n_dropped": n_dropped})


def _composition_formula(structure):
    """Formula string of a pymatgen ``Structure.as_dict()`` dict, from its sites.

    Occupancies are summed per element; the formula lists the elements in
    alphabetical order with explicit amounts, like ``Ca1F6Ti1``.
    """
    if isinstance(structure, str):
        structure = json.loads(structure)
    amounts = {}
    for site in structure["sites"]:
        for species in site["species"]:
            symbol = re.match(r"[A-Z][a-z]?", species["element"])
            if symbol is None or symbol.group() not in _ELEMENT_SET:
                raise DatasetFormatError(f"unknown element {species['element']!r} in a structure")
            element = symbol.group()
            amounts[element] = amounts.get(element, 0.0) + float(species.get("occu", 1.0))
    parts = []
    for element in sorted(amounts):
        amount = amounts[element]
        text = str(round(amount)) if abs(amount - round(amount)) < 1e-6 else f"{amount:g}"
        parts.append(f"{element}{text}")
    return "".join(parts)


def _read_mp_json(path):
    """Read DeepChem's ``mp_formation_energy.json`` (JSON lines or one JSON list of
    ``{"structure": {...}, "formation_energy": value}`` records) into (formulas, targets)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        records = json.loads(text)
        if isinstance(records, dict):
            records = [records]
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    formulas, targets = [], []
    for number, record in enumerate(records):
        target = record.get("formation_energy", record.get("e_form"))
        if "structure" not in record or target is None:
            raise DatasetFormatError(f"{path} record {number} lacks 'structure' or "
                                     f"'formation_energy' (keys: {sorted(record)})")
        formulas.append(_composition_formula(record["structure"]))
        targets.append(target)
    return formulas, targets


def load_mp_formation_energy(n=None, seed=0, dedupe=False, download=None, head=None):
    """Materials Project formation energies (eV/atom) by composition (Matbench mp_e_form).

    Reads ``mp_e_form.csv`` (columns ``formula,target``; 132,752 rows, sorted
    by target) or, if only that is present, DeepChem's
    ``mp_formation_energy.json`` (compositions taken from the structures'
    sites).  The rows are always shuffled with ``seed`` first, because the CSV
    is sorted.  ``dedupe=True`` merges rows with the same reduced formula
    into one row with the mean target (order of first appearance after the
    shuffle).  ``n`` then keeps the first ``n`` rows.  ``head`` keeps only the
    first ``head`` rows of the file *as shipped* (sorted, highest target
    first), before the shuffle: the tutorial's slice (``mp_tutorial_slice``).
    ``info`` reports the number of rows read, merged and kept.
    """
    folder = data_dir()
    json_path = os.path.join(folder, "mp_formation_energy.json")
    if not os.path.exists(os.path.join(folder, "mp_e_form.csv")) and os.path.exists(json_path):
        path = json_path
        formulas, raw_targets = _read_mp_json(path)
    else:
        path = data_path("mp_e_form.csv", download)
        columns = _read_columns(path, ["formula", "target"])
        formulas, raw_targets = columns["formula"], columns["target"]
    indices, targets, n_dropped = _finite(raw_targets)
    pairs = [(formulas[i], y) for i, y in zip(indices, targets)]
    if head is not None:
        if not isinstance(head, int) or not 0 < head <= len(pairs):
            raise ValueError(f"head={head!r} must be an int in 1..{len(pairs)} (rows in {path})")
        pairs = pairs[:head]
    random.Random(seed).shuffle(pairs)
    info = {"n_rows": len(raw_targets), "n_dropped": n_dropped, "seed": seed, "head": head}
    if dedupe:
        groups = {}
        for formula, y in pairs:
            groups.setdefault(reduced_formula(formula), []).append(y)
        info["n_merged"] = len(pairs) - len(groups)
        pairs = [(formula, sum(ys) / len(ys)) for formula, ys in groups.items()]
    if n is not None:
        if n > len(pairs):
            raise ValueError(f"n={n} is more than the {len(pairs)} rows available")
        pairs = pairs[:n]
    info["n_kept"] = len(pairs)
    return FormulaDataset(formulas=[f for f, _ in pairs], y=[y for _, y in pairs],
                          task="formation_energy_per_atom", source_file=path,
                          info=dict(info, units="eV/atom", deduped_by_reduced_formula=dedupe))


MP_TUTORIAL_ROWS = 16_000                 # the tutorial's appendix C: "MP formation energy (16000 rows)"
MP_TUTORIAL_SIZES = (8000, 1000, 2000)    # its table's train / valid / test


def mp_tutorial_slice(seed=0, download=None):
    """The tutorial's experiment-7 data, as far as it can be reconstructed: the first ``MP_TUTORIAL_ROWS``
    rows of ``mp_e_form.csv`` as shipped (the file is sorted by target, highest first, so these are the
    Materials Project entries with the highest formation energies), shuffled with ``seed``, split
    ``MP_TUTORIAL_SIZES`` in that order (the other 5,000 rows unused).  Returns (FormulaDataset of the
    16,000 shuffled rows, (train_idx, valid_idx, test_idx)).  Seed 0 gives a mean-baseline test RMSE of
    0.536 eV/atom, the tutorial's own."""
    data = load_mp_formation_energy(seed=seed, download=download, head=MP_TUTORIAL_ROWS)
    a, b, c = MP_TUTORIAL_SIZES
    return data, (list(range(a)), list(range(a, a + b)), list(range(a + b, a + b + c)))


def target_profile(y):
    """How a formation-energy target is distributed: n, min, max, mean, median (eV/atom) and the share of
    rows above 0 (unstable with respect to the elements)."""
    if not y:
        raise ValueError("target_profile: no values")
    v = sorted(float(x) for x in y)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"n": n, "min": v[0], "max": v[-1], "mean": sum(v) / n, "median": median,
            "share_positive": sum(1 for x in v if x > 0) / n}


def prediction_spread(y_true, y_pred):
    """std(y_pred) / std(y_true) (population stds): 0 for a constant prediction (the mean baseline), near 0
    for a model that is "the mean in disguise"."""
    def std(v):
        m = sum(v) / len(v)
        return math.sqrt(sum((x - m) ** 2 for x in v) / len(v))
    if len(y_true) != len(y_pred) or not y_true:
        raise ValueError(f"prediction_spread: {len(y_true)} targets and {len(y_pred)} predictions (need equal, > 0)")
    s = std([float(x) for x in y_true])
    if s == 0:
        raise ValueError("prediction_spread: the targets are constant")
    return std([float(x) for x in y_pred]) / s

def load_uspto50k(download=None):
    """USPTO-50K reactions (Schneider et al. 2016, split of Liu et al. 2017).

    Reads ``USPTO_50K.csv``: column ``reactions`` (``reactants>>product``),
    and, when present, ``class`` (1-10) and ``split`` (train/valid/test).
    The offline copy holds 50,037 reactions (40,029 / 5,004 / 5,004).
    Use ``split_reaction``, ``strip_atom_maps`` and ``filter_reactions`` on
    the result.
    """
    path = data_path("USPTO_50K.csv", download)
    columns = _read_columns(path, ["reactions"], optional=["class", "split"])
    reactions = [r.strip() for r in columns["reactions"]]
    classes = [int(c) if c.strip().isdigit() else None
               for c in columns["class"] or [""] * len(reactions)]
    splits = [s.strip() or None for s in columns["split"] or [""] * len(reactions)]
    info = {"n_rows": len(reactions),
            "split_counts": dict(Counter(s for s in splits if s is not None)),
            "class_counts": dict(sorted(Counter(c for c in classes if c is not None).items()))}
    return ReactionDataset(reactions=reactions, classes=classes, splits=splits,
                           source_file=path, info=info)


_ATOM_MAP = re.compile(r"(\[[^\[\]:]+):[0-9]+\]")


def strip_atom_maps(smiles):
    """Remove atom-map numbers: ``[CH3:1]`` -> ``[CH3]`` (pure text; the bracket
    stays, so canonicalise afterwards if you need ``C``)."""
    return _ATOM_MAP.sub(r"\1]", smiles)


def split_reaction(reaction):
    """Split ``"reactants>>product"`` into ``(reactants, product)``.

    Reactions with a reagent field (``a>b>c``) or without ``>>`` raise ValueError.
    """
    parts = reaction.split(">")
    if len(parts) != 3 or parts[1] != "":
        raise ValueError(f"reaction {reaction!r} is not of the form 'reactants>>product'")
    return parts[0], parts[2]


def filter_reactions(reactions, max_len=None, single_product=True):
    """Indices of the reactions to keep.

    ``single_product`` keeps reactions whose product side is one molecule
    (no '.'); ``max_len`` keeps those whose product SMILES *and* whole
    reactant side (dots included) are at most ``max_len`` characters.
    On the offline USPTO-50K, ``max_len=48`` keeps 24,178 reactions.
    """
    kept = []
    for i, reaction in enumerate(reactions):
        reactants, product = split_reaction(reaction)
        if single_product and "." in product:
            continue
        if max_len is not None and (len(reactants) > max_len or len(product) > max_len):
            continue
        kept.append(i)
    return kept


# =====================================================================================
# 7. Splits
# =====================================================================================

def _check_fractions(fractions):
    """Check three non-negative split fractions that sum to 1."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions {tuple(fractions)} must be three non-negative numbers "
                         f"summing to 1 (train, valid, test)")


def _assign_groups(groups, n, fractions):
    """Fill train, then valid, then test with whole groups (lists of indices),
    as DeepChem's splitters do: a group goes to train if it still fits under
    ``frac_train * n``, else to valid if it fits under ``(frac_train +
    frac_valid) * n``, else to test."""
    train_cutoff = fractions[0] * n
    valid_cutoff = (fractions[0] + fractions[1]) * n
    train, valid, test = [], [], []
    for group in groups:
        if len(train) + len(group) > train_cutoff:
            if len(train) + len(valid) + len(group) > valid_cutoff:
                test += group
            else:
                valid += group
        else:
            train += group
    return train, valid, test


def group_split(keys, fractions=(0.8, 0.1, 0.1), seed=0):
    """Split rows so that all rows sharing a key land in the same split.

    ``keys[i]`` is any hashable (a reduced formula, a product SMILES, ...).
    The distinct keys, in order of first appearance, are shuffled with
    ``seed`` and their groups assigned whole, in that order (train first).
    Returns ``(train_idx, valid_idx, test_idx)``.
    """
    _check_fractions(fractions)
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    ordered = list(groups.values())
    random.Random(seed).shuffle(ordered)
    return _assign_groups(ordered, len(keys), fractions)


def random_split(items, fractions=(0.8, 0.1, 0.1), seed=0, key=None):
    """Random split of ``items`` (a list, or a row count) into index lists.

    Equal items (or equal ``key(item)``, e.g. ``key=canonical_smiles``) are
    kept in the same split, so nothing appears in two splits; without
    repeats this is a plain shuffle and gives DeepChem's sizes
    (``int(0.8 n)``, ..., e.g. 902/113/113 for 1128 rows).  The same seed
    gives the same split.  Returns ``(train_idx, valid_idx, test_idx)``.
    """
    if isinstance(items, int):
        keys = range(items)
    else:
        keys = [key(item) for item in items] if key else list(items)
    return group_split(keys, fractions, seed)


def murcko_scaffold(smiles, include_chirality=False):
    """Bemis-Murcko scaffold SMILES of a molecule ('' for acyclic ones); needs RDKit."""
    Chem = _import_rdkit()
    from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"invalid SMILES {smiles!r}: RDKit cannot parse it")
    return MurckoScaffoldSmiles(mol=mol, includeChirality=include_chirality)


def scaffold_split(smiles, fractions=(0.8, 0.1, 0.1), include_chirality=False):
    """Deterministic Bemis-Murcko scaffold split, the algorithm of DeepChem's
    ``ScaffoldSplitter``; needs RDKit.

    Molecules are grouped by scaffold; the groups are sorted largest first
    (ties: the group whose first molecule comes later goes first, as in
    DeepChem) and assigned whole: train while they fit under
    ``frac_train * n``, then valid, then test.  On ESOL this gives
    902/113/113.  Returns ``(train_idx, valid_idx, test_idx)``.
    """
    _check_fractions(fractions)
    groups = {}
    for i, s in enumerate(smiles):
        groups.setdefault(murcko_scaffold(s, include_chirality), []).append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    return _assign_groups(ordered, len(smiles), fractions)


# =====================================================================================
# 8. Canonical SMILES, duplicates, fingerprints
# =====================================================================================

def canonical_smiles(smiles, isomeric=True, require_rdkit=False):
    """RDKit canonical SMILES, or None if RDKit cannot parse ``smiles``.

    Without RDKit this returns ``smiles.strip()`` (plain string identity),
    unless ``require_rdkit=True``, which raises ImportError instead.
    """
    try:
        Chem = _import_rdkit()
    except ImportError:
        if require_rdkit:
            raise
        return smiles.strip()
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    return Chem.MolToSmiles(mol, isomericSmiles=isomeric)


def is_valid_smiles(smiles):
    """True if RDKit parses ``smiles`` into a molecule with at least one atom; needs RDKit."""
    Chem = _import_rdkit()
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    return mol is not None and mol.GetNumAtoms() > 0


def duplicate_report(items, key=None):
    """Count repeated items, comparing ``key(item)`` (e.g. ``canonical_smiles``
    or ``reduced_formula``) or the items themselves.

    Returns a dict: ``n``, ``n_unique``, ``n_repeats`` (rows whose key
    appeared earlier), ``n_invalid`` (rows whose key is None, not counted
    as repeats) and ``groups`` (key -> row indices, only keys seen twice or more).
    """
    groups, n_invalid = {}, 0
    for i, item in enumerate(items):
        k = key(item) if key else item
        if k is None:
            n_invalid += 1
            continue
        groups.setdefault(k, []).append(i)
    repeated = {k: rows for k, rows in groups.items() if len(rows) > 1}
    return {"n": len(items), "n_unique": len(groups), "n_invalid": n_invalid,
            "n_repeats": sum(len(rows) - 1 for rows in repeated.values()),
            "groups": repeated}


def morgan_fingerprints(smiles, radius=2, n_bits=1024):
    """Morgan (ECFP-like) bit vectors as lists of 0/1 ints, one per SMILES; needs RDKit.

    Uses ``rdFingerprintGenerator``; an unparsable SMILES raises ValueError
    naming it and its position in the list.
    """
    Chem = _import_rdkit()
    from rdkit.Chem import rdFingerprintGenerator
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    vectors = []
    with _quiet_rdkit():
        for i, s in enumerate(smiles):
            mol = Chem.MolFromSmiles(s)
            if mol is None:
                raise ValueError(f"invalid SMILES {s!r} at position {i}: RDKit cannot parse it")
            vectors.append(list(generator.GetFingerprint(mol).ToList()))
    return vectors


def tanimoto(a, b):
    """Tanimoto similarity of two equal-length 0/1 bit vectors (0.0 if both are empty)."""
    if len(a) != len(b):
        raise ValueError(f"bit vectors have different lengths {len(a)} and {len(b)}")
    both = sum(1 for x, y in zip(a, b) if x and y)
    either = sum(1 for x, y in zip(a, b) if x or y)
    return both / either if either else 0.0


# =====================================================================================
# 9. Metrics and target scaling
# =====================================================================================

def _pair(y_true, y_pred):
    """Check two equal-length, non-empty lists and return them as float lists."""
    if len(y_true) != len(y_pred) or not y_true:
        raise ValueError(f"y_true has {len(y_true)} values and y_pred {len(y_pred)} "
                         f"(need the same number, > 0)")
    return [float(v) for v in y_true], [float(v) for v in y_pred]


def rmse(y_true, y_pred):
    """Root mean squared error, in the units of y."""
    t, p = _pair(y_true, y_pred)
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(t, p)) / len(t))


def mae(y_true, y_pred):
    """Mean absolute error, in the units of y."""
    t, p = _pair(y_true, y_pred)
    return sum(abs(a - b) for a, b in zip(t, p)) / len(t)


def r2(y_true, y_pred):
    """Coefficient of determination 1 - SS_res / SS_tot (0 for the mean predictor).

    Raises ValueError if ``y_true`` is constant (SS_tot = 0).
    """
    t, p = _pair(y_true, y_pred)
    mean = sum(t) / len(t)
    ss_tot = sum((a - mean) ** 2 for a in t)
    if ss_tot == 0:
        raise ValueError(f"r2 is undefined: all {len(t)} true values equal {t[0]!r}")
    return 1 - sum((a - b) ** 2 for a, b in zip(t, p)) / ss_tot


def pearson(y_true, y_pred):
    """Pearson correlation coefficient; None if either list is constant
    (e.g. the mean baseline), so that reports stay JSON-safe."""
    t, p = _pair(y_true, y_pred)
    mt, mp = sum(t) / len(t), sum(p) / len(p)
    cov = sum((a - mt) * (b - mp) for a, b in zip(t, p))
    vt = sum((a - mt) ** 2 for a in t)
    vp = sum((b - mp) ** 2 for b in p)
    if vt == 0 or vp == 0:
        return None
    return cov / math.sqrt(vt * vp)


BOOTSTRAP_METRICS = ("rmse", "mae", "mean")


def _bootstrap_terms(y_true, pred, metric):
    """Per-entry (value, weight) the metric averages: squared or absolute error, or the score itself
    (metric 'mean'; a None score, e.g. an invalid prediction under 'mean over valid', has weight 0)."""
    if metric == "mean":
        return [(0.0, 0) if v is None else (float(v), 1) for v in pred]
    t, p = _pair(y_true, pred)
    return [((a - b) ** 2 if metric == "rmse" else abs(a - b), 1) for a, b in zip(t, p)]


def _bootstrap_groups(n, groups):
    """{group: [entry indices]} in first-seen order; one group per entry without ``groups``."""
    if groups is None:
        return [[i] for i in range(n)]
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} labels for {n} predictions (need one per prediction)")
    out = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return list(out.values())


def paired_bootstrap(y_true, pred_a, pred_b, metric="rmse", n_resamples=2000, seed=0, groups=None, ci=0.95):
    """Paired bootstrap of metric(a) - metric(b) over the same test items.

    Test items are drawn with replacement ``n_resamples`` times and both models are scored on every
    draw, so the interval reflects which items happen to be in the test set, paired item by item.
    ``metric``: 'rmse' or 'mae' (against ``y_true``), or 'mean' of per-item scores (top-1 accuracy,
    Tanimoto; ``y_true`` may be None; None scores are left out of the mean, as 'mean over valid').
    ``groups``: one item label per prediction when several seeds' predictions are pooled (a run of A and
    of B per seed, concatenated): an item is drawn with every prediction that carries its label.
    Returns {diff (on the full set), ci_low, ci_high (the central ``ci`` percentile interval), n_items,
    n_resamples, metric}.  Raises ValueError on an unknown metric, unequal lengths or no resamples."""
    if metric not in BOOTSTRAP_METRICS:
        raise ValueError(f"paired_bootstrap: unknown metric {metric!r} (one of {BOOTSTRAP_METRICS})")
    if len(pred_a) != len(pred_b) or not pred_a:
        raise ValueError(f"pred_a has {len(pred_a)} values and pred_b {len(pred_b)} (need the same number, > 0)")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"paired_bootstrap: n_resamples must be a positive int, got {n_resamples!r}")
    ta, tb = (_bootstrap_terms(y_true, p, metric) for p in (pred_a, pred_b))
    sums = [tuple(sum(t[i][k] for i in ix) for t in (ta, tb) for k in (0, 1))
            for ix in _bootstrap_groups(len(pred_a), groups)]
    finish = math.sqrt if metric == "rmse" else (lambda v: v)

    def score(rows):
        sa, wa, sb, wb = (sum(r[k] for r in rows) for k in range(4))
        return None if not wa or not wb else finish(sa / wa) - finish(sb / wb)

    full = score(sums)
    if full is None:
        raise ValueError("paired_bootstrap: a side has no scored prediction (every score is None)")
    rng = random.Random(seed)
    diffs = sorted(d for d in (score(rng.choices(sums, k=len(sums))) for _ in range(n_resamples))
                   if d is not None)
    lo, hi = (diffs[min(len(diffs) - 1, max(0, round(q * (len(diffs) - 1))))] for q in ((1 - ci) / 2, (1 + ci) / 2))
    return {"metric": metric, "diff": full, "ci_low": lo, "ci_high": hi, "n_items": len(sums),
            "n_resamples": n_resamples}


class ZScore:
    """Standardise a target with the training mean and (population) standard deviation.

    ``ZScore().fit(y_train)``; ``transform(y)`` gives (y - mean) / std and
    ``inverse(z)`` maps model outputs back to the target's units, in which
    all metrics are reported.
    """

    def __init__(self, mean=None, std=None):
        """Optionally start from a known ``mean`` and ``std``."""
        self.mean = mean
        self.std = std

    def fit(self, values):
        """Learn mean and std from the training values; returns self."""
        values = [float(v) for v in values]
        if not values:
            raise ValueError("ZScore.fit needs at least one value")
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if std == 0:
            raise ValueError(f"ZScore.fit: standard deviation is 0 (all values equal {values[0]!r})")
        self.mean, self.std = mean, std
        return self

    def _check(self):
        if self.mean is None or self.std is None:
            raise ValueError("ZScore is not fitted: call fit(y_train) first")

    def transform(self, values):
        """(y - mean) / std for every value."""
        self._check()
        return [(float(v) - self.mean) / self.std for v in values]

    def inverse(self, values):
        """z * std + mean for every value (back to the target's units)."""
        self._check()
        return [float(v) * self.std + self.mean for v in values]

    def __repr__(self):
        return f"ZScore(mean={self.mean!r}, std={self.std!r})"


# =====================================================================================
# 10. Baselines: ridge regression and the mean (pure Python)
# =====================================================================================

@dataclass
class RidgeModel:
    """A fitted ridge model: ``y = sum(weights[j] * x[j]) + intercept``."""
    weights: list
    intercept: float
    alpha: float


def _cholesky_solve(A, b):
    """Solve A x = b for a symmetric positive-definite matrix A (lists of lists)."""
    n = len(A)
    L = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = A[i][j] - sum(L[i][k] * L[j][k] for k in range(j))
            if i == j:
                if s <= 0:
                    raise ValueError(f"X^T X + alpha I is not positive definite (pivot {i} = {s!r}); "
                                     f"use a larger alpha")
                L[i][i] = math.sqrt(s)
            else:
                L[i][j] = s / L[j][j]
    z = [0.0] * n                 # L z = b
    for i in range(n):
        z[i] = (b[i] - sum(L[i][k] * z[k] for k in range(i))) / L[i][i]
    x = [0.0] * n                 # L^T x = z
    for i in reversed(range(n)):
        x[i] = (z[i] - sum(L[k][i] * x[k] for k in range(i + 1, n))) / L[i][i]
    return x


def ridge_fit(X, y, alpha=1.0, fit_intercept=True):
    """Ridge regression in closed form: solve (X^T X + alpha I) w = X^T y by Cholesky.

    ``X`` is a list of equal-length rows, ``y`` a list of floats.  The
    intercept (if fitted) is not penalised.  Zero entries are skipped when
    forming X^T X, so sparse rows such as element fractions are fast.
    """
    if not X or len(X) != len(y):
        raise ValueError(f"X has {len(X)} rows but y has {len(y)} values (need the same, > 0)")
    d = len(X[0])
    m = d + 1 if fit_intercept else d
    A = [[0.0] * m for _ in range(m)]
    b = [0.0] * m
    for i, (row, target) in enumerate(zip(X, y)):
        if len(row) != d:
            raise ValueError(f"row {i} of X has {len(row)} columns, expected {d}")
        nonzero = [(j, v) for j, v in enumerate(row) if v]
        if fit_intercept:
            nonzero.append((d, 1.0))
        for j, vj in nonzero:
            b[j] += vj * target
            row_j = A[j]
            for k, vk in nonzero:
                row_j[k] += vj * vk
    for j in range(d):
        A[j][j] += alpha
    solution = _cholesky_solve(A, b)
    return RidgeModel(weights=solution[:d], intercept=solution[d] if fit_intercept else 0.0,
                      alpha=alpha)


def ridge_predict(model, X):
    """Predictions of a ``RidgeModel`` for the rows of ``X``."""
    w, b = model.weights, model.intercept
    return [b + sum(wj * xj for wj, xj in zip(w, row) if xj) for row in X]


def mean_baseline(y_train, n):
    """Predict the training mean ``n`` times (the r2 = 0 reference)."""
    if not y_train:
        raise ValueError("mean_baseline needs at least one training value")
    return [sum(y_train) / len(y_train)] * n


# =====================================================================================
# 11. Experiments 4-5: the SMILES grammar + valence constraint
# =====================================================================================

class SmilesGrammarError(ValueError):
    """A token sequence that the SMILES state machine refuses; carries the tokens and the position."""

    def __init__(self, tokens, position, reason):
        self.tokens, self.position, self.reason = list(tokens), position, reason
        super().__init__(f"token {self.tokens[position]!r} at position {position} of "
                         f"{''.join(map(str, self.tokens))!r} is not allowed: {reason}")


# ----- valence tables

# Largest valence RDKit accepts for a neutral organic-subset atom (it adds implicit H up to an allowed
# valence, so any bond total up to the largest one can be completed: P 3/5, S 2/4/6).
_MAX_VALENCE = {"B": 3, "C": 4, "N": 3, "O": 2, "P": 5, "S": 6, "F": 1, "Cl": 1, "Br": 1, "I": 1,
                "Si": 4, "Se": 6, "As": 5, "Te": 6, "Al": 3, "Ge": 4, "Sn": 4, "Pb": 4, "Hg": 2,
                "Zn": 2, "H": 1, "Li": 1, "Na": 1, "K": 1, "Mg": 2, "Ca": 2}
# Aromatic atoms: bonds inside the ring count 1 each; the capacity is the number of sigma bonds
# (c 3: two ring bonds + one substituent or a third ring bond; n 3 covers pyridine (2) and pyrrole-type
# n with a substituent; o 2; s 2; p 3; b 3).  One exocyclic double bond (c(=O)) costs 1 on the
# aromatic side: its pi electron leaves the ring for the double bond.
_AROMATIC_CAPACITY = {"b": 3, "c": 3, "n": 3, "o": 2, "p": 3, "s": 2, "se": 2, "as": 3}
_AROMATIC_DOUBLE = ("c", "s", "p", "b")        # aromatic atoms that may carry one double bond (c(=O));
                                                # n only to O (the N-oxide n=O)
_BOND_ORDER = {"-": 1, "=": 2, "#": 3, "$": 4, ":": 1, "/": 1, "\\": 1}
_BRACKET = re.compile(r"\[(\d*)([A-Z][a-z]?|[a-z][a-z]?|\*)(@*)(?:H(\d*))?([+-]*\d*)(?::\d+)?\]")
_UNLIMITED = 8


# ----- records: an atom token's kind, an atom of a parse, a parse state

@dataclass(frozen=True)
class _AtomKind:
    """What the state machine knows about an atom token."""
    symbol: str          # element as written ('c', 'Cl', 'n'); '*' for the wildcard
    aromatic: bool
    capacity: int        # bond-order total it can take (aromatic: sigma bonds)
    nitro: bool = False  # neutral aliphatic N: N(=O)=O is accepted (RDKit turns it into [N+](=O)[O-])


class _Atom(NamedTuple):
    """One atom of a parse and the bonds it has so far."""
    kind: _AtomKind
    used: int = 0        # bond-order total (aromatic: sigma bonds), open ring bonds included
    n_double: int = 0    # double bonds
    n_double_o: int = 0  # double bonds to an O (nitro N)
    neighbours: int = 0  # bonded atoms (an open ring bond is not one yet)


class _State(NamedTuple):
    """Parse state after a prefix (transitions build a new one: ``_State(...)`` or ``st._replace(...)``)."""
    prev: str = "start"  # class of the last token: 'start' (after <bos> or '.'), 'atom', 'ring', 'bond',
                         # 'open', 'close', 'end' (after <eos>)
    cur: int = None      # index of the current atom (where the next bond starts); None at a start
    pending: int = None  # order of a bond token still waiting for its atom or ring bond
    stack: tuple = ()    # the atoms the open branches hang from, innermost last
    rings: tuple = ()    # open ring bonds, sorted: ((label, (atom, order or None)), ...)
    atoms: tuple = ()    # one _Atom per atom so far
    edges: frozenset = frozenset()   # bonds as (atom, atom) pairs, ring closures included
    needy: frozenset = frozenset()   # aromatic atoms that still need neighbours (< 2 with open ring bonds)
    ringed: frozenset = frozenset()  # atoms on a cycle (only a ring closure adds cycles)


# ----- token classes

def _bracket_kind(token):
    """Light parse of a bracket atom -> _AtomKind (element valence, minus H, charge-adjusted)."""
    m = _BRACKET.fullmatch(token)
    if m is None:
        return _AtomKind(token, False, _UNLIMITED)
    symbol, h, charge = m.group(2), m.group(4), m.group(5)
    n_h = 0 if h is None else (int(h) if h else 1)
    q = 0
    if charge:
        digits = charge.lstrip("+-")
        q = (int(digits) if digits else len(charge)) * (1 if charge[0] == "+" else -1)
    aromatic = symbol.islower() and symbol != "*"
    element = symbol.capitalize() if aromatic else symbol
    base = _MAX_VALENCE.get(element)
    if base is None:
        return _AtomKind(symbol, aromatic, _UNLIMITED)
    if element in ("N", "O", "S", "P", "Se", "As"):
        base += q                           # [N+] 4, [O-] 1, [n+] 4
    elif element in ("C", "Si"):
        base -= abs(q)                      # carbocation / carbanion: 3
    elif element == "B":
        base -= q                           # [B-] 4
    cap = base - n_h - (1 if aromatic and element in ("C", "B") else 0)
    return _AtomKind(symbol, aromatic, max(cap, 0))


def _atom_kind(token):
    """_AtomKind of an atom token, or None if ``token`` is not an atom."""
    if token.startswith("[") and token.endswith("]"):
        return _bracket_kind(token)
    if token == "*":
        return _AtomKind("*", False, _UNLIMITED)
    if token in _AROMATIC_CAPACITY:
        return _AtomKind(token, True, _AROMATIC_CAPACITY[token])
    if token in _MAX_VALENCE and token != "H":
        return _AtomKind(token, False, _MAX_VALENCE[token], nitro=(token == "N"))
    return None


def _token_class(token):
    """('atom', kind) | ('bond', order) | ('open',) | ('close',) | ('ring', label) | ('dot',) | ('other',)."""
    kind = _atom_kind(token)
    if kind is not None:
        return ("atom", kind)
    if token in _BOND_ORDER:
        return ("bond", _BOND_ORDER[token])
    if token == "(":
        return ("open",)
    if token == ")":
        return ("close",)
    if len(token) == 1 and token.isdigit() or (len(token) == 3 and token[0] == "%" and token[1:].isdigit()):
        return ("ring", token)
    if token == ".":
        return ("dot",)
    return ("other",)


# ----- valences and bond rules

def _bond_cost(atom, order, partner_o):
    """(used, n_double, n_double_o) of the _Atom ``atom`` once it takes a bond of ``order``, or None if that
    would exceed its valence.  ``partner_o``: the other end is an O (only matters for nitro N)."""
    kind, used, n_double, n_dO, _ = atom
    if kind.aromatic:
        if order > 2 or (order == 2 and (n_double >= 1 or (kind.symbol not in _AROMATIC_DOUBLE and
                                                           not (kind.symbol == "n" and partner_o)))):
            return None
        used += 1
        n_double += order == 2
        return (used, n_double, n_dO) if used <= kind.capacity else None
    used += order
    n_double += order == 2
    n_dO += order == 2 and partner_o
    if used <= kind.capacity:
        return used, n_double, n_dO
    if kind.nitro and used <= 5 and n_dO >= 2:
        return used, n_double, n_dO
    return None


def _aromatic_double_ok(a, b):
    """An explicit '=' touching an aromatic atom only to a non-aromatic O or S (c=O, c=S: the only ones in
    ESOL): RDKit rejects most others (C=c, c=c, c=N inside rings) at kekulization."""
    if not (a.aromatic or b.aromatic):
        return True
    return a.aromatic != b.aromatic and (b if a.aromatic else a).symbol in ("O", "S")


def _update_needy(needy, touched, atoms, rings):
    """The set of aromatic atoms with fewer than two neighbours (open ring bonds count), after the atoms
    in ``touched`` changed."""
    out = set(needy)
    for a in touched:
        if a is None:
            continue
        kind, _, _, _, neighbours = atoms[a]
        if kind.aromatic and neighbours + sum(1 for _, (i, _) in rings if i == a) < 2:
            out.add(a)
        else:
            out.discard(a)
    return frozenset(out)


# ----- rings and aromatic systems

def _shortest_path(edges, a, b):
    """Atom indices of a shortest path a .. b over ``edges`` (pairs), or None."""
    adjacent = {}
    for x, y in edges:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    previous, frontier = {a: None}, [a]
    while frontier and b not in previous:
        nxt = []
        for x in frontier:
            for y in adjacent.get(x, ()):
                if y not in previous:
                    previous[y] = x
                    nxt.append(y)
        frontier = nxt
    if b not in previous:
        return None
    path = [b]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path


def _aromatic_ring_ok(atoms, edges, a, b, more_open):
    """A ring closure a-b (b the current atom) whose shortest ring is all aromatic must look
    kekulizable: at least 5 atoms, and at most 6 unless other ring bonds are still open (a fused
    system may close its small rings later); a 5-ring needs a heteroatom unless it is part of a fused
    system; a 6-ring with a pyrrole-type atom (o, s, [nH]) needs an exocyclic double bond on one of its
    atoms (coumarin's c(=O)o), which the current atom may still get.  A cheap filter, not a
    kekulization."""
    path = _shortest_path(edges, a, b)
    if path is None or not all(atoms[i].kind.aromatic for i in path):
        return True
    kinds = [atoms[i].kind for i in path]
    if len(path) < 5 or (len(path) > 6 and not more_open):
        return False
    if len(path) == 5:          # all-carbon 5-rings only inside fused systems (fluoranthene)
        return more_open or any(k.symbol != "c" for k in kinds) or any(atoms[i].neighbours >= 3 for i in path)
    if len(path) > 6:
        return True
    donors = any(k.symbol in ("o", "s", "se") or (k.symbol == "n" and k.capacity == 2) for k in kinds)
    cur = atoms[b]
    may_get_double = cur.kind.symbol in _AROMATIC_DOUBLE and not cur.n_double and cur.used < cur.kind.capacity
    return not donors or may_get_double or any(atoms[i].n_double for i in path)


_BRIDGES_CACHE = {}


def _bridges(edges, ports=None):
    """{bridge: (its endpoint farther from the DFS root, ports on that side, ports in its connected part)}
    for the edges (a frozenset of pairs) on no cycle: Tarjan's low-link, iterative DFS; ``ports`` ({atom:
    count}) weight the sides.  Memoized: the sibling states of one decoding step share edges and ports."""
    key = (edges, frozenset(ports.items()) if ports else None)
    got = _BRIDGES_CACHE.get(key)
    if got is not None:
        return got
    if len(_BRIDGES_CACHE) > 50_000:
        _BRIDGES_CACHE.clear()
    edges_list = list(edges)
    adjacent = {}
    for k, (x, y) in enumerate(edges_list):
        adjacent.setdefault(x, []).append((y, k))
        adjacent.setdefault(y, []).append((x, k))
    weight = ports.get if ports else (lambda a, default: 0)
    order, low, below, counter, out = {}, {}, {}, 0, {}        # below: ports in the DFS subtree
    for root in adjacent:
        if root in order:
            continue
        order[root] = low[root] = counter
        below[root] = weight(root, 0)
        counter += 1
        found = []
        stack = [(root, -1, iter(adjacent[root]))]
        while stack:
            x, via, it = stack[-1]
            for y, k in it:
                if k == via:
                    continue
                if y in order:
                    low[x] = min(low[x], order[y])
                else:
                    order[y] = low[y] = counter
                    below[y] = weight(y, 0)
                    counter += 1
                    stack.append((y, k, iter(adjacent[y])))
                    break
            else:
                stack.pop()
                if stack:
                    parent = stack[-1][0]
                    low[parent] = min(low[parent], low[x])
                    below[parent] += below[x]
                    if low[x] > order[parent]:
                        found.append((via, x))
        for k, child in found:
            out[edges_list[k]] = (child, below[child], below[root])
    _BRIDGES_CACHE[key] = out
    return out


def _ring_edges(edges, ports=None):
    """The edges (a frozenset of pairs) on a cycle; with ``ports`` also the bridges that may still join
    one: ports on both sides."""
    bridges = _bridges(edges, ports)
    return [e for e in edges if e not in bridges or (bridges[e][1] and bridges[e][2] - bridges[e][1])]


def _ports(atoms, reach, rings):
    """Where new bonds can still start: one per open ring bond, and up to two per reachable atom (current
    atom, branch stack) with free valence."""
    ports = Counter(i for _, (i, _) in rings)
    for a in set(reach):
        if a is not None and atoms[a].used < atoms[a].kind.capacity:
            ports[a] += min(2, atoms[a].kind.capacity - atoms[a].used)
    return ports


def _components(edges, nodes):
    """One representative node per connected component of ``nodes`` over ``edges``."""
    adjacent = {}
    for x, y in edges:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    seen, reps = set(), []
    for n in sorted(nodes):
        if n in seen:
            continue
        reps.append(n)
        seen.add(n)
        frontier = [n]
        while frontier:
            frontier = [y for x in frontier for y in adjacent.get(x, ()) if y not in seen]
            seen.update(frontier)
    return reps


def _flexible(atoms, candidates, ring_atoms):
    """The atoms whose aromatic pairing may still change: the candidates (current atom, branch stack)
    that have a free valence for a new neighbour or an exocyclic double bond, and every atom holding an
    open ring bond (its reserved bond may still become the ring double bond)."""
    out = set(ring_atoms)
    out.update(i for i in candidates if i is not None and atoms[i].used < atoms[i].kind.capacity)
    return out


def _can_reach_ring(atoms, edges, reach, rings, ringed):
    """Can every aromatic atom still end up on a ring?  New bonds can only start at 'ports': an open ring
    bond (one each) and a reachable atom (current, branch stack) with free valence (two if it has two
    free: it may open a ring bond and carry on).  An aromatic atom x on no cycle yet gets onto one only
    through two ports: two at x, one at x and one elsewhere, or two beyond different bonds of x (all
    of x's bonds are bridges).  Exact for 'no way at all'; it does not check that the ring would be
    aromatic."""
    loose = {x for x, a in enumerate(atoms) if a.kind.aromatic and x not in ringed}
    if not loose:
        return True
    ports = _ports(atoms, reach, rings)
    total = sum(ports.values())
    if total < 2:
        return False
    parts = Counter()                                  # per loose atom: its bonds with ports beyond them
    for (u, v), (child, side, whole) in _bridges(edges, ports).items():
        for end in (u, v):
            if end in loose and (whole - side if end == child else side):
                parts[end] += 1
    return all(ports[x] >= 2 or (ports[x] and total > ports[x]) or parts[x] >= 2 for x in loose)


def _match_all(need, avail, adjacent):
    """Backtracking perfect matching of every atom in ``need`` to a distinct neighbour in ``avail``."""
    if not need:
        return True
    a = min(need, key=lambda x: sum(1 for y in adjacent.get(x, ()) if y in avail))
    for b in adjacent.get(a, ()):
        if b in avail and b != a:
            if _match_all(need - {a, b}, avail - {a, b}, adjacent):
                return True
    return False


def _kekule_possible(atoms, edges, start, flexible):
    """Can the aromatic system containing atom ``start`` still be kekulized?  Every aromatic c without a
    double bond and every 2-connected aromatic n needs a ring double bond to a neighbour (a perfect
    matching on the aromatic bonds); atoms in ``flexible`` (the current atom, the branch stack, atoms
    with open ring bonds) may still change, so they may be matched or left out.  [nH], o and s take no
    ring double bond; other aromatic atoms (bracket charges, p, b) are treated as flexible.  Lenient:
    a True does not prove kekulization, a False does exclude it."""
    adjacent = {}
    for x, y in edges:
        if x is not None and atoms[x].kind.aromatic and atoms[y].kind.aromatic:
            adjacent.setdefault(x, set()).add(y)
            adjacent.setdefault(y, set()).add(x)
    component, frontier = {start}, [start]
    while frontier:
        frontier = [y for x in frontier for y in adjacent.get(x, ()) if y not in component]
        component.update(frontier)
    need, avail = set(), set()
    for i in component:
        kind, used, n_double, _, neighbours = atoms[i]
        if n_double:
            if kind.symbol == "n":                         # n=O: RDKit makes it [n+][O-], free for a ring bond
                avail.add(i)
            continue
        if kind.symbol == "c" or (kind.symbol == "n" and kind.capacity == 3 and neighbours == 2):
            (avail if i in flexible else need).add(i)
            avail.add(i)
        elif kind.symbol == "n" and kind.capacity == 3 and i in flexible:
            avail.add(i)
        elif kind.symbol not in ("o", "s", "se", "n") and used < kind.capacity:
            avail.add(i)                                   # bracket charges, p, b, *: lenient
    return _match_all(need, avail, adjacent)


_SYSTEMS_CACHE = {}


def _aromatic_systems_ok(atoms, edges, reach, rings):
    """Can every aromatic system still be kekulized?  ``_kekule_possible`` for each, over the bonds
    between aromatic atoms that are or may still become ring bonds, with the atoms that can still change
    (``_flexible``) left free.  Checked after every token, so a bond, branch or ring closure that
    freezes an atom or cuts off a future ring is caught where it happens."""
    aromatic = [i for i, a in enumerate(atoms) if a.kind.aromatic]
    if not aromatic:
        return True
    live = _ring_edges(edges, _ports(atoms, reach, rings))
    live = frozenset((x, y) for x, y in live if atoms[x].kind.aromatic and atoms[y].kind.aromatic)
    flexible = _flexible(atoms, reach, [i for _, (i, _) in rings]).intersection(aromatic)
    key = (live, tuple(atoms[i] for i in aromatic), frozenset(flexible))   # sibling states share it
    got = _SYSTEMS_CACHE.get(key)
    if got is None:
        if len(_SYSTEMS_CACHE) > 50_000:
            _SYSTEMS_CACHE.clear()
        got = _SYSTEMS_CACHE[key] = all(_kekule_possible(atoms, live, r, flexible)
                                        for r in _components(live, aromatic))
    return got


def _kekule_final(atoms, edges):
    """The exact test for a finished molecule, as RDKit sanitizes it: every aromatic atom lies on a ring
    ('non-ring atom marked aromatic' otherwise), and the aromatic atoms that need a ring double bond (c
    without an exocyclic double bond, 2-connected n) can be paired along ring bonds between aromatic
    atoms (a bond between aromatic atoms that is on no ring is single, so it cannot take the double)."""
    ring = _ring_edges(edges)
    on_ring = {i for e in ring for i in e}
    if any(a.kind.aromatic and i not in on_ring for i, a in enumerate(atoms)):
        return False
    aromatic_ring = [(x, y) for x, y in ring if atoms[x].kind.aromatic and atoms[y].kind.aromatic]
    if not aromatic_ring:
        return True
    start = {i for e in aromatic_ring for i in e}
    return all(_kekule_possible(atoms, aromatic_ring, i, ()) for i in _components(aromatic_ring, start))


# ----- the state machine

class SmilesConstraint:
    """Incremental SMILES grammar + valence state machine for ``transformer.generate(constraint=...)``.

    ``constraint(tokens)``: the frozenset of ids allowed after ``tokens`` (the ids so far, <bos> first),
    empty after an invalid prefix; ``check(tokens)`` raises SmilesGrammarError instead.  Parse states are
    memoized by prefix, so a decoding step costs one transition.  The masks, each with its helper:

    * <pad>, <bos>, <unk>, non-SMILES tokens, ')' without a branch, '(' on a saturated atom: ``_steps``
    * a bond, ring bond or atom beyond a valence (B 3, C 4, N 3 and nitro N(=O)=O, O 2, P 5, S 6, halogens
      1; aromatic c 3 / n 3 / o 2 / s 2, ring bonds counting 1; bracket atoms by H count and charge):
      ``_bond_cost``, with the capacities of ``_atom_kind``
    * '-', '/', '\\' between aromatic atoms, '=' at an aromatic atom other than c=O and c=S:
      ``_add_atom`` (``_aromatic_double_ok``), ``_ring_open``, ``_ring_close``
    * a ring closure onto the same atom or a bonded pair, or with conflicting orders: ``_ring_close``
    * a bond that nothing may follow: ``_allowed``
    * open rings, or aromatic atoms short of neighbours, that no reachable atom can serve: ``_alive``
    * a token after which an aromatic atom can no longer end up on a ring: ``_can_reach_ring``
    * aromatic systems that can no longer be kekulized: ``_aromatic_ring_ok`` (small rings, at a closure),
      ``_aromatic_systems_ok`` (lenient pairing, every token), ``_kekule_final`` (exact, at '.' and <eos>)
    * '.' or <eos> with a branch or ring open, after a bond or '(', before any atom, or (<eos>) with an
      aromatic atom short of neighbours: ``_allowed``, ``_can_end``
    * with ``max_new_tokens``, a token after which the molecule cannot end within the budget:
      ``_allowed_at`` (``_min_to_finish``, a cautious count; ``_finishable``, a bounded search once fewer
      than ``SLACK`` spare tokens are left)

    Not seen: a dead end that shows only tokens later (generate's ``backtrack`` undoes those), and rarer
    molecules RDKit cannot kekulize (an aromatic n=O passes, as nitro-like input).

    The budget for sampling (issue 20): ``max_new_tokens=SmilesConstraint.length_budget(train_token_lists)``
    (the training molecules' 99th-percentile token count, <eos> included, + ``LENGTH_MARGIN``) instead of
    generate's cap: a sample the model cannot close is forced shut near that length, not at the cap.
    Per-sample counters, for ``generate(..., constraint=c, backtrack=n)`` in one process::

        c.begin(); new, reason = generate(...); stats = c.sample_stats()
        # {"undos": tokens generate undid (a call whose prefix is not longer than the previous one's),
        #  "forced_closures": answers (one per decoding step; a step revisited after an undo counts again)
        #  where the budget removed a token the grammar allows: the sample was being steered shut}
    """

    LENGTH_QUANTILE = 0.99  # length_budget: this quantile of the training token counts (<eos> included) ...
    LENGTH_MARGIN = 5       # ... plus this many tokens

    @classmethod
    def length_budget(cls, token_lists, quantile=None, margin=None):
        """A ``max_new_tokens`` tied to the training lengths: the nearest-rank ``quantile`` (default
        ``LENGTH_QUANTILE``) of ``len(tokens) + 1`` (<eos>) over ``token_lists``, plus ``margin`` (default
        ``LENGTH_MARGIN``).  ValueError on an empty list or a quantile outside (0, 1]."""
        quantile = cls.LENGTH_QUANTILE if quantile is None else quantile
        margin = cls.LENGTH_MARGIN if margin is None else margin
        lengths = sorted(len(t) + 1 for t in token_lists)
        if not lengths or not 0 < quantile <= 1:
            raise ValueError(f"length_budget: need training molecules and 0 < quantile <= 1, got "
                             f"{len(lengths)} molecules and quantile {quantile!r}")
        return lengths[max(0, math.ceil(quantile * len(lengths)) - 1)] + margin

    SLACK = 8              # with max_new_tokens: search for a way to <eos> once fewer spare tokens are left
    SEARCH_NODES = 300     # states that search may expand before it trusts the estimate

    def __init__(self, vocab, max_new_tokens=None, max_cache=200_000):
        self.vocab = vocab
        self.max_new_tokens = max_new_tokens
        self._last_len, self.undos, self.forced = 0, 0, 0     # per-sample counters (begin / sample_stats)
        self.bos_id, self.eos_id = vocab.bos_id, vocab.eos_id
        self.classes = [("special",) if t in vocab.SPECIALS else _token_class(t) for t in vocab.itos]
        self.atom_ids = [i for i, c in enumerate(self.classes) if c[0] == "atom"]
        self.bond_ids = [i for i, c in enumerate(self.classes) if c[0] == "bond"]
        self.bond_set = frozenset(self.bond_ids)
        self.ring_ids = [i for i, c in enumerate(self.classes) if c[0] == "ring"]
        self.open_ids = [i for i, c in enumerate(self.classes) if c[0] == "open"]
        self.close_ids = [i for i, c in enumerate(self.classes) if c[0] == "close"]
        self.dot_ids = [i for i, c in enumerate(self.classes) if c[0] == "dot"]
        self.o_ids = {i for i in self.atom_ids if self.classes[i][1].symbol in ("O", "o")}
        self.max_cache = max_cache
        self._memo = {}            # prefix -> _State
        self._allowed_memo = {}    # prefix -> frozenset of the ids allowed after it
        self._fin = {}             # _finishable's answers
        self._forced_keys = set()  # prefixes after which the budget removed a token the grammar allows
        self._root = _State()

    # ----- public API
    def __call__(self, tokens):
        """Allowed next ids after ``tokens`` (all ids so far, starting with <bos>)."""
        key = tuple(tokens)
        if len(key) <= self._last_len:
            self.undos += 1                   # generate(backtrack=) asks again after undoing a token
        self._last_len = len(key)
        state = self._state(key)
        if state is None:
            return frozenset()
        allowed = self._allowed_after(key, state)
        if key in self._forced_keys:
            self.forced += 1
        return allowed

    def begin(self):
        """Reset the per-sample counters: call before each ``generate``."""
        self._last_len, self.undos, self.forced = 0, 0, 0

    def sample_stats(self):
        """The counters since ``begin``: {"undos": ..., "forced_closures": ...}."""
        return {"undos": self.undos, "forced_closures": self.forced}

    def check(self, tokens):
        """Raise SmilesGrammarError at the first id of ``tokens`` (starting with <bos>) that is not allowed."""
        tokens = list(tokens)
        if not tokens or tokens[0] != self.bos_id:
            raise SmilesGrammarError(tokens or ["<empty>"], 0, "a sequence starts with <bos>")
        for t in range(1, len(tokens)):
            if tokens[t] not in self(tokens[:t]):
                names = [self.vocab.itos[i] if 0 <= i < len(self.vocab) else i for i in tokens]
                raise SmilesGrammarError(names, t, self._why(tokens[:t], tokens[t]))
        return True

    def accepts(self, tokens):
        """True if every id of ``tokens`` (starting with <bos>) is allowed after the ones before it."""
        try:
            return self.check(tokens)
        except SmilesGrammarError:
            return False

    # ----- prefix -> state
    def _state(self, key):
        """The parse state after the prefix ``key`` (a tuple of ids), or None if the prefix is not allowed."""
        state = self._memo.get(key)
        if state is not None:
            return state
        if not key or key[0] != self.bos_id:
            return None
        if len(key) == 1:
            return self._root
        parent_key = key[:-1]
        parent = self._state(parent_key)
        if parent is None or key[-1] not in self._allowed_after(parent_key, parent):
            return None
        state = self._advance(parent, key[-1])
        if len(self._memo) >= self.max_cache:
            self._memo.clear()
            self._allowed_memo.clear()
            self._forced_keys.clear()
        self._memo[key] = state
        return state

    def _allowed_after(self, key, state):
        """The allowed ids after the prefix ``key`` whose parse state is ``state``, memoized by prefix."""
        allowed = self._allowed_memo.get(key)
        if allowed is None:
            allowed, forced = self._allowed_at(state, len(key))
            self._allowed_memo[key] = allowed
            if forced:
                self._forced_keys.add(key)
        return allowed

    # ----- transitions
    def _advance(self, st, tid):
        """The state after token ``tid``, or None if it breaks a valence or an aromatic rule."""
        cls = self.classes[tid]
        kind = cls[0]
        if kind == "atom":
            return self._add_atom(st, cls[1])
        if kind == "bond":
            return st._replace(prev="bond", pending=cls[1])
        if kind == "open":
            return st._replace(prev="open", pending=None, stack=st.stack + (st.cur,))
        if kind == "close":
            return st._replace(prev="close", cur=st.stack[-1], pending=None, stack=st.stack[:-1])
        if kind == "ring":
            return self._ring(st, cls[1])
        if kind == "dot":
            return st._replace(prev="start", cur=None, pending=None, stack=())
        return st._replace(prev="end", pending=None)                  # <eos>

    @staticmethod
    def _add_atom(st, kind):
        """State after an atom of ``kind`` bonded to the current atom by the pending bond (single if none),
        or None if that bond exceeds a valence, is '-', '/' or '\\' between aromatic atoms, or is a '='
        that ``_aromatic_double_ok`` refuses."""
        prev, cur, pending, stack, rings, atoms, edges, needy, ringed = st     # locals: the hottest transition
        new = _Atom(kind)
        if cur is None:                                               # the first atom of a molecule
            atoms = atoms + (new,)
        else:
            here = atoms[cur]
            if pending == 1 and kind.aromatic and here.kind.aromatic:
                return None                   # '/', '\' or '-' between aromatic atoms: never an aromatic bond
            if pending == 2 and not _aromatic_double_ok(here.kind, kind):
                return None
            if pending == 2 and kind.symbol == "S" and here.kind.aromatic:
                new = _Atom(replace(kind, capacity=2))       # c=S is a thione: the S takes no further bond
            order = pending or 1
            got = _bond_cost(here, order, kind.symbol in ("O", "o"))
            if got is None:
                return None
            mine = _bond_cost(new, order, here.kind.symbol in ("O", "o"))
            if mine is None:
                return None
            atoms = list(atoms)
            atoms[cur] = _Atom(here.kind, *got, here.neighbours + 1)
            atoms.append(_Atom(new.kind, *mine, 1))
            atoms = tuple(atoms)
            edges = edges | {(cur, len(atoms) - 1)}
        idx = len(atoms) - 1
        return _State(prev="atom", cur=idx, pending=None, stack=stack, rings=rings, atoms=atoms, edges=edges,
                      needy=_update_needy(needy, (cur, idx), atoms, rings), ringed=ringed)

    def _ring(self, st, label):
        """State after ring label ``label``: it opens a ring bond, or closes the one open under that label."""
        rings = dict(st.rings)
        if label not in rings:
            return self._ring_open(st, label, rings)
        return self._ring_close(st, label, rings)

    @staticmethod
    def _ring_open(st, label, rings):
        """Open ring bond ``label`` on the current atom, reserving its bond (the pending order, single if
        none); None if the atom cannot take it."""
        cur = st.atoms[st.cur]
        if st.pending == 2 and cur.kind.aromatic:
            return None                   # it could never close (_aromatic_double_ok)
        got = _bond_cost(cur, st.pending or 1, False)
        if got is None:
            return None
        atoms = list(st.atoms)
        atoms[st.cur] = _Atom(cur.kind, *got, cur.neighbours)        # no neighbour until it closes
        atoms = tuple(atoms)
        rings[label] = (st.cur, st.pending)
        rings = tuple(sorted(rings.items()))
        return _State(prev="ring", cur=st.cur, pending=None, stack=st.stack, rings=rings, atoms=atoms,
                      edges=st.edges, needy=_update_needy(st.needy, (st.cur,), atoms, rings), ringed=st.ringed)

    @staticmethod
    def _ring_close(st, label, rings):
        """Close ring bond ``label`` (open in ``rings``, a dict) between the atom that opened it and the
        current atom; None onto the same atom or a bonded pair, with conflicting orders, an explicit single
        or double ring bond at an aromatic atom, an exceeded valence, or a ring ``_aromatic_ring_ok``
        refuses."""
        other, opened = rings.pop(label)
        if other == st.cur or (other, st.cur) in st.edges or (st.cur, other) in st.edges:
            return None
        if opened is not None and st.pending is not None and opened != st.pending:
            return None
        order = st.pending or opened or 1
        far, cur = st.atoms[other], st.atoms[st.cur]
        if 1 in (st.pending, opened) and far.kind.aromatic and cur.kind.aromatic:
            return None                       # an explicit single ring bond between aromatic atoms
        if order == 2 and (far.kind.aromatic or cur.kind.aromatic):
            return None                       # a ring bond cannot be the exocyclic c=O of _aromatic_double_ok
        if opened is None and order != 1:     # upgrade the single bond reserved at the opening
            got = _bond_cost(far._replace(used=far.used - 1), order, False)
        else:
            got = (far.used, far.n_double, far.n_double_o)
        if got is None:
            return None
        mine = _bond_cost(cur, order, False)
        if mine is None:
            return None
        if far.kind.aromatic and cur.kind.aromatic:   # other ring bonds still open may close right here: count them
            maybe = st.edges | {(i, st.cur) for i, _ in rings.values()}
            if not (_aromatic_ring_ok(st.atoms, st.edges, other, st.cur, bool(rings)) or
                    _aromatic_ring_ok(st.atoms, maybe, other, st.cur, bool(rings))):
                return None
        atoms = list(st.atoms)
        atoms[other] = _Atom(far.kind, *got, far.neighbours + 1)
        atoms[st.cur] = _Atom(cur.kind, *mine, cur.neighbours + 1)   # kekulizability: _alive checks every system
        rings = tuple(sorted(rings.items()))
        atoms = tuple(atoms)
        edges = st.edges | {(other, st.cur)}
        return _State(prev="ring", cur=st.cur, pending=None, stack=st.stack, rings=rings, atoms=atoms,
                      edges=edges, needy=_update_needy(st.needy, (other, st.cur), atoms, rings),
                      ringed=frozenset(i for e in _ring_edges(edges) for i in e))

    # ----- what may come next
    @staticmethod
    def _min_to_finish(st):
        """A cautious estimate of the tokens still needed to end after ``st``: one ')' per open branch, a
        label and a closing atom per open ring (rings opened on the same atom need distinct closers), an
        atom after a bond or '(' (or at the start), one per aromatic atom short of neighbours, two (a label
        opened and closed) when no ring is open but an aromatic atom is on none yet, and <eos>.  Cautious
        on purpose: a tight estimate left more molecules unable to end within the budget."""
        prev, _, _, stack, rings, atoms, _, needy, ringed = st
        loose = not rings and any(a.kind.aromatic and i not in ringed for i, a in enumerate(atoms))
        return len(stack) + 2 * len(rings) + (prev in ("bond", "open", "start")) + len(needy) + 2 * loose + 1

    def _allowed_at(self, st, n_tokens):
        """(allowed ids, forced) after a prefix of ``n_tokens`` ids (<bos> included); with ``max_new_tokens`` a
        token is kept only if the molecule can still be finished (closed and ended with <eos>) within
        the budget of new tokens; ``forced``: the budget removed a token the grammar allows."""
        grammar = self._allowed(st)
        allowed = grammar
        if self.max_new_tokens is not None and st is not self._root:
            room = self.max_new_tokens - n_tokens      # new tokens left after this one (n_tokens - 1 used)
            if room + 1 - self._min_to_finish(st) < self.SLACK and not self._finishable(st, room + 1):
                return frozenset(), False  # no way found to <eos> in the budget: generate(backtrack=) undoes it
            allowed = [t for t in grammar if t == self.eos_id or self._min_to_finish(self._advance(st, t)) <= room]
        return frozenset(allowed), len(allowed) < len(grammar)

    def _finishable(self, st, room, nodes=None):
        """True if a continuation of at most ``room`` tokens (<eos> included) leads from ``st`` to <eos>
        through the allowed sets, each state on it within ``_min_to_finish`` of the budget: a depth-first
        search, lowest estimate first, memoized by parse state (``_fin`` keeps the largest room known too
        small and the smallest known enough).  A "yes" is a real path.  A "no" is cautious like the
        estimate: a path squeezing in under it is not taken (closing early left more molecules valid).
        After ``SEARCH_NODES`` expanded states without an answer it trusts the estimate."""
        nodes = [self.SEARCH_NODES] if nodes is None else nodes
        if self._min_to_finish(st) > room:
            return False
        key = (st.prev, st.cur, st.pending, st.stack, st.rings, st.atoms, st.edges)
        too_small, enough = self._fin.get(key, (-1, None))
        if room <= too_small:
            return False
        if enough is not None and room >= enough:
            return True
        if nodes[0] <= 0:
            return True                       # search budget spent: the estimate's answer (room >= need)
        nodes[0] -= 1
        found = self._can_end(st) and _kekule_final(st.atoms, st.edges)
        if not found:
            for need, _, nxt, check in sorted((self._min_to_finish(nxt), tid, nxt, check)
                                              for tid, nxt, check in self._steps(st)):
                if need > room - 1:
                    break
                if (not check or self._alive(nxt)) and self._finishable(nxt, room - 1, nodes):
                    found = True
                    break
        if nodes[0] > 0:                      # an answer from a search cut short is not memoized
            if len(self._fin) >= self.max_cache:
                self._fin.clear()
            too_small, enough = self._fin.get(key, (-1, None))
            self._fin[key] = ((too_small, min(room, enough or room)) if found else (max(room, too_small), enough))
        return found

    def _steps(self, st):
        """(id, state, needs _alive) for every token but '.' and <eos> that the grammar and the valences allow
        after ``st``, before the costly checks: ``_allowed`` runs them on every state (and keeps a bond
        only if something may follow it), the budget search only on the states it enters."""
        prev = st.prev
        if prev == "end":
            return []
        out = [(tid, self._advance(st, tid), True) for tid in self.atom_ids]
        if prev != "start":
            after_atom = prev in ("atom", "ring", "close")
            cur_atom = st.atoms[st.cur]
            if after_atom or prev == "open":
                out += [(tid, self._advance(st, tid), False) for tid in self.bond_ids
                        if _bond_cost(cur_atom, self.classes[tid][1], True) is not None]
            if prev in ("atom", "ring", "bond", "close"):
                out += [(tid, self._ring(st, self.classes[tid][1]), True) for tid in self.ring_ids]
            if after_atom and self._free(cur_atom):
                out += [(tid, self._advance(st, tid), False) for tid in self.open_ids]
            if after_atom and st.stack:
                out += [(tid, self._advance(st, tid), True) for tid in self.close_ids]
        return [x for x in out if x[1] is not None]

    def _alive(self, st):
        """The molecule can still be completed: every aromatic atom short of neighbours is the current atom
        or on the branch stack with a free valence, open rings have a reachable atom with a free valence,
        every aromatic atom can still end up on a ring (``_can_reach_ring``), and every aromatic system can
        still be kekulized (``_aromatic_systems_ok``)."""
        _, cur, _, stack, rings, atoms, edges, needy, ringed = st
        reach = (cur,) + stack if cur is not None else stack
        for a in needy:
            if a not in reach or not self._free(atoms[a]):
                return False
        if rings and not any(self._free(atoms[a]) for a in reach):
            return False
        return _can_reach_ring(atoms, edges, reach, rings, ringed) and _aromatic_systems_ok(atoms, edges, reach, rings)

    @staticmethod
    def _free(atom):
        """The _Atom can take one more bond."""
        return atom.used < atom.kind.capacity

    def _can_end(self, st):
        return st.prev in ("atom", "ring", "close") and not st.stack and not st.rings and not st.needy

    def _allowed(self, st):
        """The allowed ids after ``st`` without the budget: ``_steps`` that pass ``_alive`` (a bond needs an
        atom or ring bond after it), then '.' and <eos> where ``_kekule_final`` passes the frozen molecule."""
        out = [tid for tid, nxt, check in self._steps(st)
               if (self._alive(nxt) if check else tid not in self.bond_set or self._allowed(nxt))]
        if st.prev in ("atom", "ring", "close"):
            final = None                   # '.' and <eos> freeze every atom so far: the exact test
            if not st.stack and not st.rings:
                final = _kekule_final(st.atoms, st.edges)
                if final:
                    out.extend(self.dot_ids)
            if self._can_end(st):
                if final is None:
                    final = _kekule_final(st.atoms, st.edges)
                if final:
                    out.append(self.eos_id)
        return out

    def _why(self, prefix, tid):
        """A short reason why ``tid`` is not allowed after ``prefix`` (for error messages)."""
        st = self._state(tuple(prefix))
        if st is None:
            return "the prefix itself is invalid"
        cls = self.classes[tid] if 0 <= tid < len(self.classes) else ("other",)
        if tid == self.eos_id:
            if st.stack:
                return "<eos> while a branch is open"
            if st.rings:
                return f"<eos> while ring bond(s) {[r for r, _ in st.rings]} are open"
            if st.prev in ("atom", "ring", "close") and not st.needy and not _kekule_final(st.atoms, st.edges):
                return "<eos> here: an aromatic atom is on no ring, or the aromatic rings cannot be kekulized"
            return "<eos> here would leave an incomplete molecule (after a bond, '(' or a lone aromatic atom)"
        if cls[0] in ("special", "other"):
            return "not a SMILES token"
        if cls[0] == "close" and not st.stack:
            return "')' without an open branch"
        return f"{cls[0]} token after a '{st.prev}' token would break the grammar or exceed a valence"


# =====================================================================================
# 12. Experiments 4-5: why RDKit rejects a string, and SELFIES
# =====================================================================================

# Why RDKit rejects a string: the categories of the tutorial's failure analysis.
FAILURE_REASONS = ("unk", "unbalanced_branch", "unclosed_ring", "valence", "kekulization", "other")


def _ring_labels_balanced(tokens):
    counts = Counter(t for t in tokens if _token_class(t)[0] == "ring")
    return all(n % 2 == 0 for n in counts.values())


def smiles_failure_reason(smiles):
    """None if RDKit parses ``smiles``, else one of FAILURE_REASONS:

    'unk' (the string holds <unk>), 'unbalanced_branch' (parentheses do not pair), 'unclosed_ring'
    (a ring-bond label occurs an odd number of times), 'valence' (RDKit's AtomValenceException),
    'kekulization' (KekulizeException / AtomKekulizeException, including 'non-ring atom marked
    aromatic'), 'other' (empty string, untokenizable text, duplicate ring bond, ...).  Needs RDKit.
    """
    Chem = _import_rdkit()
    if "<unk>" in smiles:
        return "unk"
    if not smiles:
        return "other"
    try:
        tokens = tokenize_smiles(smiles)
    except ValueError:
        return "other"
    depth = 0
    for t in tokens:
        depth += (t == "(") - (t == ")")
        if depth < 0:
            return "unbalanced_branch"
    if depth:
        return "unbalanced_branch"
    if not _ring_labels_balanced(tokens):
        return "unclosed_ring"
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles, sanitize=False)
        if mol is None or mol.GetNumAtoms() == 0:
            return "other"
        problems = [p.GetType() for p in Chem.DetectChemistryProblems(mol)]
        if not problems and Chem.MolFromSmiles(smiles) is not None:
            return None
    if "AtomValenceException" in problems:
        return "valence"
    if any("Kekulize" in p for p in problems):
        return "kekulization"
    return "other"


# SELFIES (the tutorial's remedy): tokens are the bracketed SELFIES symbols.
def _import_selfies():
    try:
        import selfies
    except ImportError as e:
        raise ImportError(f"SELFIES needs the selfies package: {CHEM_EXTRA_HINT}") from e
    return selfies


def smiles_to_selfies(smiles):
    """SELFIES string of a SMILES, encoded from RDKit's canonical SMILES (so a nitro N(=O)=O arrives as
    [N+](=O)[O-], which SELFIES' valence rules accept); ValueError naming the SMILES if RDKit cannot
    parse it or selfies cannot encode it."""
    sf = _import_selfies()
    canonical = canonical_smiles(smiles, require_rdkit=True)
    if canonical is None:
        raise ValueError(f"selfies cannot encode SMILES {smiles!r}: RDKit cannot parse it")
    try:
        return sf.encoder(canonical, strict=True)
    except sf.EncoderError as e:
        raise ValueError(f"selfies cannot encode SMILES {smiles!r}: {e}") from None


def selfies_to_smiles(selfies_string):
    """SMILES decoded from a SELFIES string (every SELFIES string decodes; '' for an empty one)."""
    sf = _import_selfies()
    try:
        return sf.decoder(selfies_string)
    except sf.DecoderError as e:
        raise ValueError(f"selfies cannot decode {selfies_string!r}: {e}") from None


def tokenize_selfies(selfies_string):
    """Split a SELFIES string into its bracketed symbols; ``''.join`` gives the string back.
    Raises ValueError naming the string if it is not a sequence of [...] symbols."""
    tokens = re.findall(r"\[[^\[\]]*\]|\.", selfies_string)
    if "".join(tokens) != selfies_string:
        raise ValueError(f"not a SELFIES string (expected [..] symbols): {selfies_string!r}")
    return tokens


# =====================================================================================
# 12b. Experiment 4: the n-gram baseline and distribution metrics (GuacaMol, MOSES)
# =====================================================================================

GUACAMOL_HINT = "pip install --no-deps guacamol==0.5.5 && pip install fcd==1.2.2 tqdm joblib"


class NgramLM:
    """Token n-gram language model with interpolated Kneser-Ney smoothing, on the same ids as the
    Transformer (``fit(sequences)``: lists of ids, <bos> first, <eos> last).

    P(w | h) = max(c(h w) - D, 0) / c(h) + D N1+(h .) / c(h) P(w | h'), h' = h without its first id;
    the highest order uses counts, the lower ones continuation counts (distinct left neighbours), the
    unigram is interpolated with uniform over all ``vocab_size`` ids (so every id has p > 0 and each
    distribution sums to 1).  A history with no count falls back to the lower order.  Sequences are
    left-padded with n - 2 extra <bos> so every prediction has a full history.

    ``next_logits(ids)`` = log P(. | last n - 1 ids): the next-token row that
    ``transformer.generate`` samples from, the same path (temperature, top-k, constraint, backtrack)
    as the Transformer's.  ``bits(sequence)`` = - log2 P of every target after the first id."""

    def __init__(self, vocab_size, n=3, discount=0.75, bos_id=1):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"NgramLM: n must be an int >= 1, got {n!r}")
        if not 0 < discount < 1:
            raise ValueError(f"NgramLM: discount must be in (0, 1), got {discount!r}")
        self.vocab_size, self.n, self.discount, self.bos_id = vocab_size, n, discount, bos_id
        self.counts = [dict() for _ in range(n)]         # order k + 1: {history of k ids: Counter(next)}
        self._cache = {}

    def _padded(self, ids):
        return [self.bos_id] * (self.n - 2) + list(ids) if self.n > 2 else list(ids)

    def fit(self, sequences):
        top, n = self.counts[self.n - 1], self.n
        for seq in sequences:
            if any(not 0 <= i < self.vocab_size for i in seq):
                raise ValueError(f"NgramLM.fit: an id outside 0..{self.vocab_size - 1} in {seq!r}")
            ids = self._padded(seq)
            for t in range(1, len(ids)):
                if t >= n - 1:
                    h = tuple(ids[t - n + 1:t]) if n > 1 else ()
                    top.setdefault(h, Counter())[ids[t]] += 1
        for k in range(n - 1, 0, -1):                        # continuation counts of order k from k + 1
            lower = self.counts[k - 1]
            for h, nxt in self.counts[k].items():
                for w in nxt:
                    lower.setdefault(h[1:], Counter())[w] += 1
        self._cache = {}
        return self

    def _dist(self, h):
        """P(. | h) over all ids (h: a tuple of up to n - 1 ids), memoized."""
        if h in self._cache:
            return self._cache[h]
        V, D = self.vocab_size, self.discount
        lower = self._dist(h[1:]) if h else [1.0 / V] * V
        c = self.counts[len(h)].get(h)
        if not c:
            p = lower
        else:
            total = sum(c.values())
            back = D * len(c) / total
            p = [back * q for q in lower]
            for w, k in c.items():
                p[w] += (k - D) / total
        self._cache[h] = p
        return p

    def probs(self, ids):
        """P(next id | ids) as a list over the vocabulary."""
        ids = self._padded(ids)
        return self._dist(tuple(ids[len(ids) - self.n + 1:]) if self.n > 1 else ())

    def next_logits(self, ids):
        return [math.log(p) for p in self.probs(ids)]

    def bits(self, seq):
        """- log2 P of each target seq[1:] (a list)."""
        return [-math.log2(self.probs(seq[:t])[seq[t]]) for t in range(1, len(seq))]


def ngram_bits_per_token(model, sequences):
    """Token-weighted bits/token of ``sequences`` (every target after <bos>, <eos> included)."""
    bits = [b for s in sequences for b in model.bits(s)]
    return math.fsum(bits) / len(bits)


def fit_ngram(train, valid, vocab_size, bos_id, orders=(2, 3, 4, 5), discounts=(0.5, 0.75, 0.9)):
    """Choose n and the discount D on the validation sequences (lowest bits/token); returns
    (the chosen NgramLM fitted on train, [{n, discount, valid_bits_per_token}] of every pair tried)."""
    grid = []
    for n in orders:
        for d in discounts:
            m = NgramLM(vocab_size, n, d, bos_id).fit(train)
            grid.append({"n": n, "discount": d, "valid_bits_per_token": ngram_bits_per_token(m, valid)})
    best = min(grid, key=lambda g: g["valid_bits_per_token"])
    return NgramLM(vocab_size, best["n"], best["discount"], bos_id).fit(train), grid


def _import_guacamol_fcd():
    """(KLDivBenchmark, fcd module, versions); ImportError naming the install line if absent.  guacamol
    0.5.5 imports ``scipy.histogram``, gone from current SciPy: it is aliased to numpy's first."""
    try:
        import numpy
        import scipy
        if not hasattr(scipy, "histogram"):
            scipy.histogram = numpy.histogram
        from guacamol.distribution_learning_benchmark import KLDivBenchmark
        import fcd
    except ImportError as e:
        raise ImportError(f"guacamol / fcd are needed for the distribution metrics ({e}); "
                          f"install them with: {GUACAMOL_HINT}") from e
    from importlib.metadata import version
    return KLDivBenchmark, fcd, {"guacamol": version("guacamol"), "fcd": version("fcd")}


def distribution_packages_available():
    """True when guacamol and fcd import (the distribution metrics can run)."""
    try:
        _import_guacamol_fcd()
        return True
    except ImportError:
        return False


class _ListGenerator:
    """A guacamol DistributionMatchingGenerator that hands out a fixed list of SMILES in order."""

    def __init__(self, smiles):
        self.smiles, self.at = list(smiles), 0

    def generate(self, number_samples):
        out = self.smiles[self.at:self.at + number_samples]
        self.at += number_samples
        return out


def guacamol_kl_score(samples, reference):
    """GuacaMol's KL-divergence score of ``samples`` (SMILES; invalid ones are skipped by guacamol) against
    ``reference`` with ``KLDivBenchmark`` itself: number_samples = min(unique valid samples, reference
    size), so the reference subset is the whole set when the samples are as many.  Returns
    {score, number_samples, kl_divergences}; score None with ``error`` when the set is too small or too
    uniform for guacamol's kernel density estimates (fewer than 2 unique valid samples, one value)."""
    KLDivBenchmark, _, _ = _import_guacamol_fcd()
    unique = list(dict.fromkeys(c for c in (canonical_smiles(s) for s in samples if s) if c))
    if len(unique) < 2:
        return {"score": None, "number_samples": len(unique), "error": "fewer than 2 unique valid samples"}
    n = min(len(unique), len(reference))
    import numpy
    try:
        with _quiet_rdkit():
            res = KLDivBenchmark(number_samples=n, training_set=list(reference)).assess_model(_ListGenerator(unique))
    except (ValueError, numpy.linalg.LinAlgError) as e:     # a set too small or too uniform for its KDEs
        return {"score": None, "number_samples": n, "error": f"{type(e).__name__}: {e}"}
    if not math.isfinite(res.score):
        return {"score": None, "number_samples": n, "error": "guacamol returned a non-finite score"}
    return {"score": float(res.score), "number_samples": n,
            "kl_divergences": {k: float(v) for k, v in res.metadata.get("kl_divs", {}).items()}}


def kl_score_at_size(samples, reference, size, repeats=10, seed=0):
    """GuacaMol's KL score at a fixed sample size: the mean and sample standard deviation of
    ``guacamol_kl_score`` over ``repeats`` seeded random subsets of ``size`` unique valid samples.  The
    score rises with the number of samples (its histograms and kernel densities are noisier on fewer), so
    sets of different sizes (2,000 samples, a 113-molecule test split) compare only at one size.  A set
    with at most ``size`` unique valid samples is scored once, whole.  Returns {size, repeats, mean, sd,
    scores}; mean None when the set is too small (``guacamol_kl_score``'s error)."""
    unique = list(dict.fromkeys(c for c in (canonical_smiles(s) for s in samples if s) if c))
    rng = random.Random(seed)
    subsets = [unique] if len(unique) <= size else [rng.sample(unique, size) for _ in range(repeats)]
    scores = [guacamol_kl_score(x, reference)["score"] for x in subsets]
    ok = [x for x in scores if x is not None]
    mean = sum(ok) / len(ok) if ok else None
    sd = (sum((x - mean) ** 2 for x in ok) / (len(ok) - 1)) ** 0.5 if len(ok) > 1 else 0.0 if ok else None
    return {"size": min(size, len(unique)), "repeats": len(subsets), "mean": mean, "sd": sd, "scores": scores}


def fcd_score(samples, reference):
    """Fréchet ChemNet Distance (``fcd.get_fcd`` on RDKit-canonical SMILES, as GuacaMol canonicalises before
    scoring; ChemNet weights shipped in the wheel) of the valid samples against ``reference``, and GuacaMol's score exp(-0.2 FCD): {fcd, score, n}."""
    _, fcd, _ = _import_guacamol_fcd()
    valid = [c for c in (canonical_smiles(s) for s in samples if s) if c]
    if len(valid) < 2:
        return {"fcd": None, "score": None, "n": len(valid), "error": "fewer than 2 valid samples"}
    with _quiet_rdkit():
        d = float(_fcd_distance(fcd, valid, tuple(reference)))
    return {"fcd": d, "score": math.exp(-0.2 * d), "n": len(valid)}


_FCD_MEMO = {}


def _fcd_distance(fcd, smiles, reference):
    """``fcd.get_fcd(smiles, reference)`` step by step, with ChemNet and the reference's mean and
    covariance computed once per reference set (the same numbers, several times faster on a table)."""
    import numpy
    if "model" not in _FCD_MEMO:
        _FCD_MEMO["model"] = fcd.load_ref_model()
    model = _FCD_MEMO["model"]

    def stats(mols):
        act = fcd.get_predictions(model, list(mols), n_jobs=0, device="cpu")   # 0: no DataLoader worker fork
        return numpy.mean(act, axis=0), numpy.cov(act.T)
    if _FCD_MEMO.get("reference") != reference:
        _FCD_MEMO["reference"], _FCD_MEMO["stats"] = reference, stats(canonical_smiles(s) for s in reference)
    mu1, sigma1 = stats(smiles)
    mu2, sigma2 = _FCD_MEMO["stats"]
    return fcd.calculate_frechet_distance(mu1=mu1, mu2=mu2, sigma1=sigma1, sigma2=sigma2)


def _mols(smiles):
    Chem = _import_rdkit()
    with _quiet_rdkit():
        mols = [Chem.MolFromSmiles(s) for s in smiles if s]
    return [m for m in mols if m is not None]


def _fps(mols):
    from rdkit.Chem import rdFingerprintGenerator
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024)
    return [gen.GetFingerprint(m) for m in mols]


def _cosine(a, b):
    """Cosine similarity of two {key: count} Counters (MOSES cos_similarity)."""
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    na, nb = math.sqrt(sum(v * v for v in a.values())), math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb) if na and nb else None


def _fragments(mols):
    """BRICS fragment counts, as MOSES compute_fragments (FragmentOnBRICSBonds, SMILES split at '.')."""
    from rdkit import Chem
    from rdkit.Chem import AllChem
    out = Counter()
    for m in mols:
        out.update(Chem.MolToSmiles(AllChem.FragmentOnBRICSBonds(m)).split("."))
    return out


def _scaffolds(mols):
    """Bemis-Murcko scaffold counts, as MOSES compute_scaffolds (acyclic molecules' '' left out)."""
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold
    out = Counter(Chem.MolToSmiles(MurckoScaffold.GetScaffoldForMol(m)) for m in mols)
    out.pop("", None)
    return out


def moses_metrics(samples, reference):
    """MOSES-style metrics of the valid samples (all of them, duplicates kept, as MOSES does) against
    ``reference`` (Morgan radius 2, 1024 bits):
    IntDiv1 = 1 - mean Tanimoto over all sample pairs (i = j included), SNN = mean over samples of the
    highest Tanimoto to a reference molecule, Frag / Scaf = cosine similarity of BRICS-fragment /
    Murcko-scaffold counts.  None where a set is empty."""
    from rdkit import DataStructs
    gen, ref = _mols(samples), _mols(reference)
    if not gen:
        return {"n_valid": 0, "int_div1": None, "snn": None, "frag": None, "scaf": None}
    g, r = _fps(gen), _fps(ref)
    pairs = [math.fsum(DataStructs.BulkTanimotoSimilarity(f, g)) for f in g]
    snn = [max(DataStructs.BulkTanimotoSimilarity(f, r)) for f in g]
    return {"n_valid": len(gen), "int_div1": 1 - math.fsum(pairs) / len(g) ** 2,
            "snn": math.fsum(snn) / len(snn), "frag": _cosine(_fragments(gen), _fragments(ref)),
            "scaf": _cosine(_scaffolds(gen), _scaffolds(ref))}


def length_histogram(token_counts, edges=tuple(range(0, 101, 5))):
    """Counts of token lengths per bin [edges[i], edges[i+1]) (the last bin takes everything above)."""
    import bisect
    counts = [0] * (len(edges) - 1)
    for n in token_counts:
        counts[min(len(counts) - 1, max(0, bisect.bisect_right(edges, n) - 1))] += 1
    return {"edges": list(edges), "counts": counts}


def distribution_metrics(samples, reference, long_tokens=90):
    """Every distribution metric of one set of SMILES against the reference (the training split):
    GuacaMol KL and FCD scores, MOSES IntDiv1 / SNN / Frag / Scaf, and the atom-token length histogram
    (``tokenize_smiles`` of each valid sample as spelled) with the share >= ``long_tokens`` tokens.
    Invalid or empty strings count only in n.  Needs RDKit, guacamol and fcd (``GUACAMOL_HINT``)."""
    out = {"kl": guacamol_kl_score(samples, reference), "fcd": fcd_score(samples, reference)}
    out.update(moses_metrics(samples, reference))
    lengths = [len(tokenize_smiles(s)) for s in samples if s and canonical_smiles(s)]
    out["length_histogram"] = length_histogram(lengths)
    out["share_long"] = sum(n >= long_tokens for n in lengths) / len(lengths) if lengths else None
    out["mean_tokens"] = sum(lengths) / len(lengths) if lengths else None
    out["long_tokens"] = long_tokens
    return out


def distribution_package_versions():
    """{package: version} of guacamol and fcd, recorded in the results (ImportError with GUACAMOL_HINT when absent)."""
    return _import_guacamol_fcd()[2]


def tutorial_novelty(samples, train_canonical):
    """The tutorial's generation scores of SMILES ``samples`` (None = invalid, e.g. no <eos>):
    validity = valid / n, uniqueness = unique valid / n, novelty = novel unique / unique valid (the
    tutorial's), novelty_of_valid = novel valid / valid (ours).  ``train_canonical``: a set of canonical
    SMILES."""
    canon = [canonical_smiles(s) if s and "<unk>" not in s else None for s in samples]
    valid = [c for c in canon if c]
    unique = set(valid)
    n = len(samples)
    return {"n": n, "n_valid": len(valid), "n_unique_valid": len(unique), "validity": len(valid) / n if n else None,
            "uniqueness": len(unique) / n if n else None,
            "novelty": len(unique - train_canonical) / len(unique) if unique else None,
            "novelty_of_valid": sum(c not in train_canonical for c in valid) / len(valid) if valid else None,
            "canonical": canon}


def tutorial_scores_by_block(canonical, train_canonical, size):
    """The tutorial's validity, uniqueness and novelty on consecutive blocks of ``size`` samples, as
    {size, blocks, validity|uniqueness|novelty: {mean, sd}} (sd None for one block; novelty's mean over
    the blocks that have a valid sample); None when there are fewer than ``size`` samples.
    ``canonical``: canonical SMILES or None per sample, in sampling order (samples are independent
    draws, so every block is a fair sample of ``size``).  Uniqueness (unique valid / n) falls as n
    grows, since repeats pile up, and novelty of the unique ones rises: scores at different n do not
    compare, so a setting sampled more often than the tutorial's 200 is compared at 200 this way."""
    if size < 1 or len(canonical) < size:
        return None
    per = {"validity": [], "uniqueness": [], "novelty": []}
    for a in range(0, len(canonical) - size + 1, size):
        valid = [c for c in canonical[a:a + size] if c]
        unique = set(valid)
        per["validity"].append(len(valid) / size)
        per["uniqueness"].append(len(unique) / size)
        if unique:
            per["novelty"].append(len(unique - train_canonical) / len(unique))

    def stat(v):
        if not v:
            return {"mean": None, "sd": None}
        m = math.fsum(v) / len(v)
        return {"mean": m, "sd": math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None}
    return {"size": size, "blocks": len(per["validity"]), **{k: stat(v) for k, v in per.items()}}


# =====================================================================================
# 13. Experiments 6-8: randomized SMILES, ESOL descriptors, element fractions, formula orders
# =====================================================================================

def randomized_smiles(smiles, n, rng):
    """``n`` random (non-canonical) SMILES of one molecule, atoms renumbered with ``rng`` (a
    ``random.Random``), so the same seed gives the same strings.  Repeats are possible for small
    molecules.  An unparsable SMILES raises ValueError naming it.  Needs RDKit."""
    Chem = _import_rdkit()
    with _quiet_rdkit():
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
    Chem = _import_rdkit()
    from rdkit.Chem import Crippen, Descriptors, Lipinski
    with _quiet_rdkit():
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
    Chem = _import_rdkit()
    with _quiet_rdkit():
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
    pairs = _ELEMENT_AMOUNT.findall(formula)
    if not _SIMPLE_FORMULA.fullmatch(formula) or not pairs:
        raise ValueError(f"formula_reordered needs a formula without brackets, got {formula!r}")
    if sorted(order) != list(range(len(pairs))):
        raise ValueError(f"order {order!r} is not a permutation of the {len(pairs)} elements of {formula!r}")
    return "".join(pairs[i][0] + pairs[i][1] for i in order)


def formula_orders(formula, k, rng):
    """Up to ``k`` distinct rewrites of ``formula`` in element orders other than its own (all of them
    when there are fewer), drawn with ``rng``; [] for a one-element formula."""
    n = len(_ELEMENT_AMOUNT.findall(formula))
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
# 14. Experiment 7: element features (periodic-table priors for formula models)
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
    ELEMENT_FEATURE_SOURCE).  With ``standardize`` every feature is z-scored over the given symbols, so a
    learned projection starts on a sensible scale.  An unknown symbol raises ValueError naming it."""
    Chem = _import_rdkit()
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


# =====================================================================================
# 15. Experiments 6-8: saved property predictors
# =====================================================================================

class PredictorFormatError(ValueError):
    """A model file is not a property predictor (missing meta keys, unknown tokenizer)."""


def _formula_alphabetical_explicit(formula):
    """``formula`` rewritten as in ``mp_e_form.csv``: elements in alphabetical order, every amount
    written (``Mg2Si`` -> ``Mg2Si1``; ``Ca3(PO4)2`` -> ``Ca3O8P2``)."""
    composition = parse_formula(formula)
    return "".join(f"{e}{composition[e]:g}" for e in sorted(composition))


PREDICTOR_TOKENIZERS = {"smiles_atom": tokenize_smiles, "formula": tokenize_formula}
"""Tokenizer names a saved predictor may name in its meta, and the functions they stand for."""

_PREDICTOR_META_KEYS = ("tokenizer", "vocab_tokens", "target_mean", "target_std", "units", "task")

PREDICT_STATUSES = ("ok", "unchecked", "out_of_domain", "invalid", "error")
"""ok: a valid input inside the applicability domain; unchecked: predicted, but validity (no RDKit) or the
domain (no training reference in the model file) could not be checked; out_of_domain: predicted, outside
the training data (the reason says how); invalid: RDKit cannot parse the SMILES (predicted for the string);
error: not predicted."""

DEFAULT_MAX_INPUT_TOKENS = 400
"""Inputs longer than this many tokens are refused at once (status error) instead of being run through
the model (a 5,000-character SMILES took minutes; the committed models saw at most 97 ESOL and a few
hundred HOPV tokens).  ``Predictor(max_input_tokens=...)`` or ``predict --max-input-tokens N`` changes it."""

DOMAIN_COVERAGE = 0.9
"""The similarity threshold of the applicability domain is the similarity below which the least similar
10 % of the validation inputs fall (their nearest training neighbour), rounded down to 0.01."""

LEGACY_SMILES_PREPARATION = {
    "recorded": False, "trained_on_canonical": False,
    "source": "dataset SMILES as written (whitespace stripped), not canonicalised",
    "how_known": "not recorded in the model file; the experiment 6 and 8 demos before issue 22 trained on "
                 "load_esol() / load_hopv() strings as written, and the committed models' train_data_sha256 "
                 "equals the sha256 of exactly those strings for their split"}
"""What a SMILES model file without ``meta['smiles_preparation']`` was trained on (the committed models)."""

NO_REFERENCE = "domain not checked (model file has no training reference)"


def _stereo_kinds(tokens):
    """Which stereo marks occur in ``tokens``: {'chiral': '@' in a bracket atom, 'double_bond': / or \\}."""
    tokens = list(tokens)
    return {"chiral": any("@" in t for t in tokens), "double_bond": any(t in ("/", "\\") for t in tokens)}


def _mol_without_stereo(mol, keep):
    """Remove from an RDKit molecule (in place) the stereo kinds not in ``keep``; True if any was there."""
    Chem = _import_rdkit()
    removed = False
    if not keep["chiral"]:
        for atom in mol.GetAtoms():
            if atom.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED:
                atom.SetChiralTag(Chem.ChiralType.CHI_UNSPECIFIED)
                removed = True
    if not keep["double_bond"]:
        for bond in mol.GetBonds():
            if bond.GetStereo() != Chem.BondStereo.STEREONONE or bond.GetBondDir() != Chem.BondDir.NONE:
                bond.SetStereo(Chem.BondStereo.STEREONONE)
                bond.SetBondDir(Chem.BondDir.NONE)
                removed = True
    return removed


def prepare_smiles(smiles, keep_stereo):
    """(RDKit canonical SMILES, removed_stereo) of ``smiles`` with the stereo kinds the training data never
    had removed (``keep_stereo`` as ``_stereo_kinds`` gives it); (None, False) if RDKit cannot parse it.
    Every spelling of one molecule gives the same string.  Needs RDKit."""
    Chem = _import_rdkit()
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        return None, False
    removed = _mol_without_stereo(mol, keep_stereo)
    return Chem.MolToSmiles(mol), removed


_TRAINING_STYLE = ((("[N+]", "[O-]"), (("[N+](=O)[O-]", "N(=O)=O"), ("O=[N+]([O-])", "O=N(=O)"),
                                         ("[O-][N+](=O)", "O=N(=O)"))),
                   (("-",), ()))
"""Rewrites of an RDKit canonical SMILES into the spelling of the ESOL/HOPV files, for models trained on
those files as written: a nitro group as N(=O)=O instead of [N+](=O)[O-], and no '-' between aromatic
rings.  A rewrite applies only when its tokens are unseen by the model (``_in_training_style``)."""


def _in_training_style(smiles, known_tokens):
    """``smiles`` (RDKit canonical) rewritten with ``_TRAINING_STYLE`` where the canonical form holds tokens
    the model never saw, if the result is the same molecule (checked with RDKit); else ``smiles``."""
    text = smiles
    for tokens, replacements in _TRAINING_STYLE:
        if not any(t in tokenize_smiles(text) and t not in known_tokens for t in tokens):
            continue
        for old, new in replacements:
            text = text.replace(old, new)
        if not replacements:                                   # a bond symbol: drop the token
            text = "".join(t for t in tokenize_smiles(text) if t not in tokens)
    if text == smiles or canonical_smiles(text) != canonical_smiles(smiles):
        return smiles
    return text


def smiles_preparation_record(train_smiles):
    """The ``meta['smiles_preparation']`` a SMILES model file records: whether its training SMILES were
    RDKit-canonical (and the fraction that were), which stereo marks they held, and how inputs are prepared."""
    _import_rdkit()
    from rdkit import rdBase
    n_canonical = sum(1 for s in train_smiles if canonical_smiles(s) == s)
    return {"recorded": True, "trained_on_canonical": n_canonical == len(train_smiles),
            "canonical_fraction": n_canonical / max(1, len(train_smiles)),
            "stereo_in_training": _stereo_kinds(t for s in train_smiles for t in tokenize_smiles(s)),
            "input": "RDKit canonical SMILES, stereo marks the training data never had removed",
            "rdkit_version": rdBase.rdkitVersion}


def _fingerprint_int(mol, radius, n_bits):
    """Morgan fingerprint of an RDKit molecule as a Python int (bit i = fingerprint bit i)."""
    from rdkit.Chem import rdFingerprintGenerator
    bits = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits).GetFingerprint(mol)
    return int(bits.ToBitString()[::-1], 2)


def _composition_fractions(formula):
    """{element: atom fraction} of a formula."""
    composition = parse_formula(formula)
    total = sum(composition.values())
    return {e: n / total for e, n in composition.items()}


def composition_similarity(a, b):
    """1 - half the L1 distance of two {element: fraction} dicts (= the sum over shared elements of the
    smaller fraction): 1 for equal compositions, 0 for disjoint ones."""
    return 1.0 - 0.5 * sum(abs(a.get(e, 0.0) - b.get(e, 0.0)) for e in set(a) | set(b))


def domain_reference(tokenizer, train_items, radius=2, n_bits=1024):
    """The training reference ``meta['domain']`` stores: the token-length range of the training inputs and,
    for SMILES, their distinct Morgan fingerprints (radius 2, 1024 bits, as hex strings; needs RDKit, else
    None); for formulas, the distinct training formulas.  The similarity threshold is set later, on the
    validation split (``property_common.applicability_domain``)."""
    lengths = [len(PREDICTOR_TOKENIZERS[tokenizer](x)) for x in train_items]
    ref = {"token_length_range": [min(lengths), max(lengths)], "threshold": None, "threshold_rule": None}
    if tokenizer == "formula":
        ref.update(kind="composition", train_formulas=sorted(set(train_items)))
        return ref
    if not rdkit_available():
        return None
    Chem = _import_rdkit()
    with _quiet_rdkit():
        mols = [Chem.MolFromSmiles(s) for s in train_items]
    fps = {_fingerprint_int(m, radius, n_bits) for m in mols if m is not None}
    ref.update(kind="morgan_tanimoto", radius=radius, n_bits=n_bits,
               train_fingerprints_hex=sorted(format(f, "x") for f in fps))
    return ref


def domain_threshold(similarities, coverage=DOMAIN_COVERAGE):
    """The similarity below which the least similar ``1 - coverage`` of ``similarities`` fall (None values
    skipped), rounded down to 0.01: inputs under it are out of domain.  None if nothing is left."""
    values = sorted(s for s in similarities if s is not None)
    if not values:
        return None
    return math.floor(values[int((1.0 - coverage) * len(values))] * 100) / 100


@dataclass
class Prediction:
    """One input's outcome: ``value`` in the target's units (None when it could not be predicted),
    ``status`` one of ``PREDICT_STATUSES``, ``reason`` (why not, or what to be careful about), ``n_unk``
    tokens unseen in training, ``domain`` 'in' / 'out' / 'not checked', ``prepared`` the string the model
    read (the RDKit canonical SMILES) and ``similarity`` to the nearest training input (None if unknown)."""
    input: str
    value: object
    status: str
    reason: str = ""
    n_unk: int = 0
    domain: str = "not checked"
    prepared: str = ""
    similarity: object = None


def _positive_int(name, value, minimum):
    """``value`` if it is an int >= ``minimum``, else ValueError/TypeError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


class Predictor:
    """A saved TransformerEncoder with everything needed to use it on new molecules or formulas.

    ``predict(inputs)`` -> list of floats (None where an input cannot be predicted);
    ``predict_detailed(inputs)`` -> list of ``Prediction`` with the status, domain and reason of each input.
    A SMILES is read as its RDKit canonical form (stereo marks the training data never had removed), so
    every spelling of a molecule gets the same prediction; ``n_random`` > 0 averages the model over that
    form and ``n_random`` random spellings of it (fixed seed: still one prediction per molecule).  Inputs
    over ``max_input_tokens`` tokens are refused at once.  One bad input never stops the others."""

    def __init__(self, model, meta, path="", max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, n_random=0):
        missing = [k for k in _PREDICTOR_META_KEYS if k not in meta]
        if missing:
            raise PredictorFormatError(f"{path}: not a property predictor, meta lacks {missing}")
        if meta["tokenizer"] not in PREDICTOR_TOKENIZERS:
            raise PredictorFormatError(f"{path}: unknown tokenizer {meta['tokenizer']!r}; "
                                       f"known: {sorted(PREDICTOR_TOKENIZERS)}")
        self.model, self.meta, self.path = model, meta, path
        self.vocab = Vocab(meta["vocab_tokens"])
        self.tokenize = PREDICTOR_TOKENIZERS[meta["tokenizer"]]
        self.units, self.task = meta["units"], meta["task"]
        self.max_tokens = meta.get("max_tokens")
        self.max_input_tokens = _positive_int("max_input_tokens", max_input_tokens, 1)
        self.n_random = _positive_int("n_random", n_random, 0)
        self.is_smiles = meta["tokenizer"] == "smiles_atom"
        prep = meta.get("smiles_preparation")
        self.preparation = prep or (LEGACY_SMILES_PREPARATION if self.is_smiles else None)
        self.keep_stereo = (prep or {}).get("stereo_in_training") or _stereo_kinds(self.vocab.tokens)
        self.reference = meta.get("domain")
        self._train = None

    def _prepare(self, text):
        """(string the model reads, its tokens, notes, validity 'valid'/'invalid'/'unchecked');
        raises ValueError when the input cannot be predicted (empty, untokenisable, too long)."""
        text = text.strip() if isinstance(text, str) else text
        if not isinstance(text, str) or not text:
            raise ValueError("empty input")
        notes, validity = [], "valid"
        if self.meta.get("formula_style") == "alphabetical_explicit":
            rewritten = _formula_alphabetical_explicit(text)
            if rewritten != text:
                notes.append(f"read as {rewritten}")
            text = rewritten
        tokens = self.tokenize(text)
        if len(tokens) > self.max_input_tokens:
            raise ValueError(f"{len(tokens)} tokens, over the input limit of {self.max_input_tokens} "
                             "(--max-input-tokens / max_input_tokens= changes it)")
        if self.is_smiles and not rdkit_available():
            validity = "unchecked"
            notes.append("RDKit not installed: validity and canonical form not checked")
        elif self.is_smiles:
            canonical, removed = prepare_smiles(text, self.keep_stereo)
            if canonical is None:
                validity = "invalid"
                notes.append("RDKit cannot parse this SMILES: prediction for a string, not a molecule")
            else:
                if not self.preparation["trained_on_canonical"]:
                    canonical = _in_training_style(canonical, self.vocab.stoi)
                text, tokens = canonical, tokenize_smiles(canonical)
                if removed:
                    notes.append("stereo ignored (the training data had no such marks)")
        return text, tokens, notes, validity

    def _z(self, tokens):
        """(model output in z units, tokens unseen in training, whether it was cut to max_tokens)."""
        before = self.vocab.unk_count
        ids = self.vocab.encode(tokens)
        n_unk = self.vocab.unk_count - before
        cut = bool(self.max_tokens) and len(ids) > self.max_tokens
        if cut:
            ids = ids[:self.max_tokens - 1] + [self.vocab.eos_id]
        return self.model.forward(ids)[0], n_unk, cut

    def _value(self, text, tokens, validity, notes):
        """(prediction in the target's units, n_unk): one forward, or the mean over n_random spellings too."""
        z, n_unk, cut = self._z(tokens)
        if cut:
            notes.append(f"cut to {self.max_tokens} tokens as in training")
        if self.n_random and self.is_smiles and validity == "valid":
            spellings = randomized_smiles(text, self.n_random, random.Random(0))
            zs = [z] + [self._z(tokenize_smiles(s))[0] for s in spellings]
            z = sum(zs) / len(zs)
            notes.append(f"mean over the canonical and {self.n_random} random SMILES")
        return z * self.meta["target_std"] + self.meta["target_mean"], n_unk

    def _train_reference(self):
        """The training fingerprints (ints) or compositions, decoded once from the meta."""
        if self._train is None:
            ref = self.reference
            if ref["kind"] == "composition":          # element -> [(training index, atom fraction)]
                self._train = {}
                for i, formula in enumerate(ref["train_formulas"]):
                    for e, frac in _composition_fractions(formula).items():
                        self._train.setdefault(e, []).append((i, frac))
            else:
                self._train = [int(h, 16) for h in ref["train_fingerprints_hex"]]
        return self._train

    def similarity(self, text, validity="valid"):
        """Similarity of a prepared input to its nearest training input (Morgan Tanimoto for SMILES, 1 - half
        the L1 distance of the atom fractions for formulas); None without a reference, RDKit or a molecule."""
        if self.reference is None or validity != "valid":
            return None
        train = self._train_reference()
        if self.reference["kind"] == "composition":   # composition_similarity = sum of shared min fractions
            shared = Counter()
            for e, frac in _composition_fractions(text).items():
                for i, g in train.get(e, ()):
                    shared[i] += min(frac, g)
            return max(shared.values(), default=0.0)
        Chem = _import_rdkit()
        with _quiet_rdkit():
            mol = Chem.MolFromSmiles(text)
        fp = _fingerprint_int(mol, self.reference["radius"], self.reference["n_bits"])
        return max(((fp & t).bit_count() / ((fp | t).bit_count() or 1) for t in train), default=0.0)

    def _domain(self, text, tokens, n_unk, validity):
        """(domain 'in'/'out'/'not checked', reasons, nearest-neighbour similarity) of a prepared input."""
        reasons = [f"{n_unk} token(s) unseen in training (<unk>)"] if n_unk else []
        if self.reference is None:
            return ("out" if reasons else "not checked"), reasons + [NO_REFERENCE], None
        lo, hi = self.reference["token_length_range"]
        if not lo <= len(tokens) <= hi:
            reasons.append(f"{len(tokens)} tokens, outside the training range {lo}-{hi}")
        sim, threshold = self.similarity(text, validity), self.reference.get("threshold")
        if sim is not None and threshold is not None and sim < threshold:
            reasons.append(f"nearest training neighbour similarity {sim:.2f} < {threshold:.2f} "
                           "(threshold chosen on the validation split)")
        if reasons:
            return "out", reasons, sim
        if sim is None or threshold is None:
            why = "no similarity threshold in the model file" if threshold is None else f"input {validity}"
            return "not checked", [f"similarity not checked ({why})"], sim
        return "in", [], sim

    def domain_of(self, text):
        """(domain, reasons, similarity) of one input without running the model (ValueError if unusable)."""
        prepared, tokens, _, validity = self._prepare(text)
        n_unk = sum(1 for t in tokens if t not in self.vocab.stoi)
        return self._domain(prepared, tokens, n_unk, validity)

    def _one(self, text):
        """The ``Prediction`` of one input; raises ValueError when it cannot be predicted."""
        prepared, tokens, notes, validity = self._prepare(text)
        value, n_unk = self._value(prepared, tokens, validity, notes)
        domain, reasons, sim = self._domain(prepared, tokens, n_unk, validity)
        if validity == "invalid":
            status = "invalid"
        elif domain == "out":
            status = "out_of_domain"
        else:
            status = "ok" if validity == "valid" and domain == "in" else "unchecked"
        notes = notes[:1] + reasons + notes[1:] if validity != "valid" else reasons + notes
        return Prediction(str(text), value, status, "; ".join(notes), n_unk, domain, prepared, sim)

    def predict_detailed(self, inputs):
        """A ``Prediction`` per input, in order; an input that cannot be predicted gets status 'error'."""
        out = []
        for text in inputs:
            try:
                out.append(self._one(text))
            except ValueError as e:
                out.append(Prediction(str(text), None, "error", str(e)))
            except Exception as e:            # never let one input stop the others
                out.append(Prediction(str(text), None, "error", f"{type(e).__name__}: {e}"))
        return out

    def predict(self, inputs):
        """Values in the target's units, None where an input could not be predicted."""
        return [p.value for p in self.predict_detailed(inputs)]

    def describe(self):
        """One line of context: model file, target and units, validation RMSE, input preparation, domain."""
        rmse = self.meta.get("valid_rmse")
        parts = [f"model {self.path}: {self.task} in {self.units}",
                 f"validation RMSE {rmse:.3g} {self.units} (a rough uncertainty)" if rmse is not None
                 else "validation RMSE not recorded"]
        if self.preparation:
            p = self.preparation
            trained = ("trained on canonical SMILES" if p["trained_on_canonical"] else
                       f"trained on {p['source']}" if not p["recorded"] else
                       f"trained on SMILES of which {p['canonical_fraction']:.0%} were RDKit-canonical")
            parts.append(trained + "; inputs read as RDKit canonical SMILES")
        if self.n_random:
            parts.append(f"mean over {1 + self.n_random} spellings")
        ref = self.reference
        parts.append(NO_REFERENCE if ref is None else
                     f"domain: training token lengths {ref['token_length_range'][0]}-{ref['token_length_range'][1]}"
                     + (f", nearest-neighbour similarity >= {ref['threshold']:.2f}" if ref.get("threshold")
                        is not None else ", no similarity threshold"))
        parts.append(f"inputs over {self.max_input_tokens} tokens refused")
        return "; ".join(parts)

    def __repr__(self):
        return f"Predictor({self.task!r} in {self.units}, tokenizer {self.meta['tokenizer']}, {self.path})"


def _predictor_meta(path):
    """The ``meta`` of model file ``path``, read with errors that name the file: PredictorFormatError when
    it is not UTF-8 JSON holding an object, or when its ``vocab_tokens`` (plus the 4 specials) disagree
    with the model's ``vocab_size``; a missing file is FileNotFoundError (which names it)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except ValueError as e:                                  # JSONDecodeError, UnicodeDecodeError
        raise PredictorFormatError(f"{path}: not a readable model file ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("meta") or {}, dict):
        raise PredictorFormatError(f"{path}: not a model file (no JSON object with a 'meta' object)")
    meta = obj.get("meta") or {}
    tokens, size = meta.get("vocab_tokens"), (obj.get("config") or {}).get("vocab_size")
    if tokens is not None:
        try:
            n = len(Vocab(tokens))
        except (TypeError, ValueError) as e:
            raise PredictorFormatError(f"{path}: meta.vocab_tokens is not a token list ({e})") from None
        if size is not None and n != size:
            raise PredictorFormatError(f"{path}: meta.vocab_tokens gives {n} ids with the {len(Vocab.SPECIALS)} "
                                       f"specials, but the model's vocab_size is {size}")
    return meta


def load_predictor(path, **options):
    """Load a model file written by the property demos (``models/*.json``) as a ``Predictor``; ``options``
    (max_input_tokens, n_random) go to ``Predictor``."""
    import transformer
    meta = _predictor_meta(path)
    return Predictor(transformer.load_model(path), meta, path, **options)


def _read_csv_text(path):
    """(text, note) of a CSV file: UTF-8 (a BOM is dropped), else Latin-1 with a note naming the first line
    that is not UTF-8 (Latin-1 decodes every byte, so nothing is refused)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig"), ""
    except UnicodeDecodeError as e:
        text = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
        line = text.count(b"\n", 0, e.start) + 1          # e.start counts from after the BOM
        return text.decode("latin-1"), f"{path} is not UTF-8 (line {line} first); read as Latin-1"


def _csv_rows(text):
    """(line number, fields or None, csv error) for every record of ``text``; a record the csv module
    cannot parse gives its error instead of stopping the rest."""
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield reader.line_num, None, str(e)
            continue
        yield reader.line_num, row, ""


def _csv_row_outcome(predictor, number, row, error, n_fields, col):
    """(output fields, Prediction) of one data row: ragged, empty or unparsable rows are reported by line
    and keep the header's columns; a row with more fields than the header is not predicted."""
    if row is None:
        return [""] * n_fields, Prediction("", None, "error", f"line {number}: {error}")
    if not any(field.strip() for field in row):
        return row[:n_fields] + [""] * (n_fields - len(row)), Prediction("", None, "error", f"line {number} is empty")
    fields = row[:n_fields] + [""] * (n_fields - len(row))
    if len(row) > n_fields:
        extra = ",".join(row[n_fields:])[:60]
        return fields, Prediction(row[col], None, "error", f"line {number} has {len(row)} fields, the header "
                                  f"{n_fields}: not predicted, columns would not line up (extra: {extra!r})")
    res = predictor.predict_detailed([fields[col]])[0]
    if len(row) < n_fields:
        res.reason = f"line {number} has {len(row)} fields, the header {n_fields}" + (f"; {res.reason}"
                                                                                        if res.reason else "")
    return fields, res


def _check_out_path(out_path, in_path):
    """Refuse an output path in a missing folder, or the input file itself (before any work)."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--out {out_path}: the folder {folder} does not exist (create it first)")
    if os.path.exists(out_path) and os.path.samefile(out_path, in_path):
        raise ValueError(f"--out {out_path} is the input file: refusing to overwrite it")


def predict_csv(predictor, in_path, column, out_path=None):
    """Add ``prediction_<units>``, ``status``, ``domain`` and ``reason`` columns to every row of a CSV file.

    Read as UTF-8 (BOM dropped), else Latin-1 (stated).  Every record after the header is kept, in order,
    with the header's number of fields; a row that is empty, ragged or unparsable gets an empty prediction
    and its line number.  Writes ``out_path`` atomically (UTF-8; its folder must exist) or returns the
    text when it is None.  Returns (text or path, counts by status, notes)."""
    if out_path is not None:
        _check_out_path(out_path, in_path)
    text, note = _read_csv_text(in_path)
    records = _csv_rows(text)
    first = next(records, None)
    header = [h.strip() for h in first[1]] if first and first[1] else []
    if column not in header:
        raise DatasetFormatError(f"{in_path} has no column {column!r} (its columns: {header})")
    col, buf, counts = header.index(column), io.StringIO(), Counter()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(first[1] + [f"prediction_{predictor.units}", "status", "domain", "reason"])
    for number, row, error in records:
        fields, res = _csv_row_outcome(predictor, number, row, error, len(header), col)
        counts[res.status] += 1
        value = "" if res.value is None else f"{res.value:.6g}"
        writer.writerow(fields + [value, res.status, res.domain if res.status != "error" else "", res.reason])
    notes = [note] if note else []
    if out_path is None:
        return buf.getvalue(), dict(counts), notes
    atomic_write(out_path, buf.getvalue())
    return out_path, dict(counts), notes


# =====================================================================================
# 16. Experiment 9: reaction product prediction (exact match, heavy atoms, baselines)
# =====================================================================================

def _reaction_mol(smiles):
    """RDKit molecule of ``smiles``, or None if it is empty, not a string or unparsable; needs RDKit."""
    Chem = _import_rdkit()
    if not isinstance(smiles, str) or not smiles.strip():
        return None
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def canonical_match(predicted, truth):
    """True if ``predicted`` is the same molecule as ``truth`` once RDKit has canonicalised both
    (a reordered or otherwise different valid spelling of the right product counts as a hit).

    An empty or unparsable prediction is never a match; an unparsable ``truth`` raises ValueError
    naming it (the reference answer must be a molecule).  Stereochemistry counts.  Needs RDKit.
    """
    _import_rdkit()
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
    Chem = _import_rdkit()
    order = list(range(mol.GetNumAtoms()))
    random.Random(seed).shuffle(order)
    return Chem.MolToSmiles(Chem.RenumberAtoms(mol, order), canonical=False)


# =====================================================================================
# 16b. Experiment 5: the partner of each closing token (ring digit, ')')
# =====================================================================================

def closing_partners(tokens):
    """For each token of a tokenised SMILES (no special tokens), its partner if it closes something:
    ('ring', j) when token i is the ring label that closes the ring opened by the same label at token j,
    ('branch', j) when token i is the ')' of the '(' at token j; None otherwise.  A ring label that is
    seen again after closing opens a new ring ('C1CC1C1CC1').  Raises SmilesGrammarError (with the
    tokens and the position) on a ')' with no open '(' and on a ring or branch still open at the end."""
    out, opens, stack = [None] * len(tokens), {}, []
    for i, tok in enumerate(tokens):
        cls = _token_class(tok)[0]
        if cls == "ring":
            if tok in opens:
                out[i] = ("ring", opens.pop(tok))
            else:
                opens[tok] = i
        elif cls == "open":
            stack.append(i)
        elif cls == "close":
            if not stack:
                raise SmilesGrammarError(tokens, i, "')' with no open '('")
            out[i] = ("branch", stack.pop())
    left = sorted(list(opens.values()) + stack)
    if left:
        raise SmilesGrammarError(tokens, left[0], "ring or branch never closed")
    return out


# =====================================================================================
# 17. Command line: python chemdata.py fetch | check | predict
# =====================================================================================

def _check_command(args):
    """Print the status of every data file (ok / missing / sha256 mismatch); 0 if all are ok, else 1."""
    report = check_data_files()
    for name, status in report.items():
        print(f"{status:>16}  {os.path.join(data_dir(), name)}")
    return 0 if all(s == "ok" for s in report.values()) else 1


def _fetch_command(args):
    """Download the missing data files (sha256-checked, written atomically; built files last), then check.
    Each file that cannot be had is reported once, with the folder it belongs in; a built file whose
    sources are missing is not retried but named in one line."""
    failed = set()
    for name in sorted(DATA_FILES, key=lambda n: "built_from" in DATA_FILES[n]):   # built files last
        sources = _liu_files() if "built_from" in DATA_FILES[name] else []
        if failed.intersection(sources):
            where = os.path.join(data_dir(), DATA_FILES[name]["built_from"])
            print(f"fetch: {name} is built from the {len(sources)} files of {where}; "
                  f"{len(failed.intersection(sources))} of them are missing (above), so it was not built",
                  file=sys.stderr)
            continue
        try:
            data_path(name, download=True)
        except (DatasetNotFoundError, ChecksumError, DatasetFormatError) as exc:
            failed.add(name)
            print(f"fetch: {exc}", file=sys.stderr)
    return _check_command(args)


def _predict_csv_command(args, predictor):
    """``predict --csv``: the CSV with four new columns (stdout or --out); context and counts on stderr."""
    try:
        result, counts, notes = predict_csv(predictor, args.csv, args.column, args.out)
    except (OSError, ValueError) as e:
        print(f"predict: {e}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(result)
    for line in [predictor.describe()] + notes:
        print(f"predict: {line}", file=sys.stderr)
    print(f"predict: rows by status {counts}" + (f"; wrote {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _predict_command(args):
    """A context line (``# model ...``), a header row and one tab-separated line per input (input,
    prediction_<units>, status, domain, reason), or the CSV with four new columns."""
    if bool(args.csv) == bool(args.inputs):
        args.parser.error("give either inputs on the command line or --csv FILE")
    try:
        predictor = load_predictor(args.model, max_input_tokens=args.max_input_tokens, n_random=args.random_smiles)
    except (OSError, ValueError, TypeError) as e:
        print(f"predict: cannot load {args.model}: {e}", file=sys.stderr)
        return 2
    if args.csv:
        return _predict_csv_command(args, predictor)
    print(f"# {predictor.describe()}")
    print("\t".join(["input", f"prediction_{predictor.units}", "status", "domain", "reason"]))
    for res in predictor.predict_detailed(args.inputs):
        value = "" if res.value is None else f"{res.value:.4f}"
        print("\t".join([res.input, value, res.status, res.domain if res.status != "error" else "", res.reason]))
    return 0


def _parser():
    """The argparse parser of ``python chemdata.py``: one subcommand per job."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python chemdata.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The data folder ($CHEMDATA_DIR, else data/ beside chemdata.py) and the saved models.",
        epilog="examples:\n  python chemdata.py fetch\n  python chemdata.py check\n"
               "  python chemdata.py predict models/esol_transformer.json CCO c1ccccc1O\n"
               "  python chemdata.py predict models/esol_transformer.json --csv in.csv --column smiles --out out.csv")
    sub = parser.add_subparsers(dest="command", metavar="{fetch,check,predict}", required=True)
    fetch = sub.add_parser("fetch", help="download the missing data files, then check them",
                           description="Download every missing data file (sha256-checked, written atomically), "
                           "then report as check does.")
    fetch.set_defaults(run=_fetch_command)
    check = sub.add_parser("check", help="report every data file: ok / missing / sha256 mismatch",
                           description="Report every data file: ok / missing / sha256 mismatch.  "
                           "Exit status 0 when all are ok, else 1.")
    check.set_defaults(run=_check_command)
    predict = sub.add_parser("predict", help="predict a property with a saved model (models/*.json)",
                             description="Predict a property with a saved model (models/*.json).")
    predict.add_argument("model")
    predict.add_argument("inputs", nargs="*", help="SMILES or formulas, one prediction line each")
    predict.add_argument("--csv", help="input CSV file")
    predict.add_argument("--column", default="smiles", help="CSV column with the inputs (default smiles)")
    predict.add_argument("--out", help="output CSV (default: standard output); its folder must exist")
    predict.add_argument("--max-input-tokens", type=int, default=DEFAULT_MAX_INPUT_TOKENS, metavar="N",
                         help=f"refuse longer inputs at once (default {DEFAULT_MAX_INPUT_TOKENS} tokens)")
    predict.add_argument("--random-smiles", type=int, default=0, metavar="N",
                         help="average over the canonical SMILES and N random spellings of it (default 0)")
    predict.set_defaults(run=_predict_command, parser=predict)
    return parser


def main(argv=None):
    """``python chemdata.py fetch | check | predict MODEL INPUT... | predict MODEL --csv IN [--column COL]
    [--out OUT]``; ``--help`` after any of them says more.  Returns the exit status (check: 0 when every
    data file is present and verified); a usage error exits with status 2 (SystemExit), as argparse does."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
