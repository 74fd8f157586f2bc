"""Saved property predictors: a trained model on new molecules or formulas, with a status per input.

The property studies (experiment 6 ESOL solubility, experiment 7 formation energy from a formula,
experiment 8 HOPV) save their Transformer encoders as ``models/*.json``; this module uses them:

    1. meta and limits       PredictorFormatError, PREDICTOR_TOKENIZERS, PREDICT_STATUSES,
                             DEFAULT_MAX_INPUT_TOKENS, LEGACY_SMILES_PREPARATION
    2. preparing a SMILES    prepare_smiles (RDKit canonical form, stereo the training data never had
                             removed), smiles_preparation_record (what a model file records)
    3. applicability domain  domain_reference, domain_threshold (set on the validation split,
                             DOMAIN_COVERAGE), composition_similarity, NO_REFERENCE
    4. the predictor         load_predictor -> Predictor; predict_detailed gives a Prediction per input
    5. CSV files             predict_csv (four new columns on every row)
    6. the command           ``python chemdata.py predict MODEL INPUT... | --csv FILE``:
                             add_predict_command adds it to chemdata's parser

Standard library only at module level; RDKit and ``transformer`` are imported by the functions that need
them.  ``chemdata`` re-exports every name in ``__all__`` (``chemdata.load_predictor`` works too).
"""

import csv
import io
import json
import math
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass

from chemdata import (DatasetFormatError, Vocab, _import_rdkit, _quiet_rdkit, canonical_smiles, parse_formula,
                      rdkit_available, tokenize_formula, tokenize_smiles)
from property_features import randomized_smiles
from safe_io import atomic_write

__all__ = ["PredictorFormatError", "PREDICTOR_TOKENIZERS", "PREDICT_STATUSES", "DEFAULT_MAX_INPUT_TOKENS",
           "DOMAIN_COVERAGE", "LEGACY_SMILES_PREPARATION", "NO_REFERENCE", "prepare_smiles",
           "smiles_preparation_record", "composition_similarity", "domain_reference", "domain_threshold",
           "Prediction", "Predictor", "load_predictor", "predict_csv", "add_predict_command"]


# =====================================================================================
# 1. The model file's meta, the input statuses and limits
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


# =====================================================================================
# 2. Preparing a SMILES: canonical form, stereo, the training data's spelling
# =====================================================================================

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


# =====================================================================================
# 3. The applicability domain: the training reference and the similarity threshold
# =====================================================================================

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


# =====================================================================================
# 4. The predictor
# =====================================================================================

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


# =====================================================================================
# 5. CSV files
# =====================================================================================

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
# 6. The predict command (python chemdata.py predict ...; chemdata.main dispatches)
# =====================================================================================

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


def add_predict_command(subparsers):
    """Add the ``predict`` subcommand to the argparse ``subparsers`` of ``python chemdata.py``
    (``chemdata.main`` parses and dispatches); returns its parser."""
    predict = subparsers.add_parser("predict", help="predict a property with a saved model (models/*.json)",
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
    return predict
