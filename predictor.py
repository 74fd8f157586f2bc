"""Saved property predictors: a trained model on new molecules or formulas, with a status per input.

The property studies (experiment 6 ESOL solubility, experiment 7 formation energy from a formula,
experiment 8 HOPV) save their Transformer encoders as ``models/*.json``; this module uses them:

    1. meta and limits       PredictorFormatError, PREDICTOR_TOKENIZERS, PREDICT_STATUSES,
                             DEFAULT_MAX_INPUT_TOKENS, LEGACY_SMILES_PREPARATION; the model file's meta
                             is checked whole at load (_meta_problems)
    2. preparing a SMILES    prepare_smiles (RDKit canonical form, stereo the training data never had
                             removed), smiles_preparation_record (what a model file records)
    3. applicability domain  domain_reference, domain_threshold (set on the validation split,
                             DOMAIN_COVERAGE), composition_similarity, NO_REFERENCE
    4. the predictor         load_predictor -> Predictor; predict_detailed gives a Prediction per input
                             (a list of strings in; each distinct one predicted once, on N processes);
                             an ensemble file's members averaged, with their spread and a calibrated
                             interval (conformal_quantile, interval_scale, interval_half_width)
    5. files                 one pipeline: read (a stream, binary files refused) -> dedupe -> predict in
                             parallel (predict_chunks) -> stream out in input order to <out>.partial,
                             resumable after an interruption (predict_csv: seven new columns per row)
    6. the command           ``python chemdata.py predict MODEL INPUT... | --csv FILE [--out F [--resume]]``:
                             add_predict_command adds it to chemdata's parser

Standard library only at module level; RDKit and ``transformer`` are imported by the functions that need
them.  ``chemdata`` re-exports every name in ``__all__`` (``chemdata.load_predictor`` works too).
"""

import argparse
import codecs
import contextlib
import csv
import io
import itertools
import json
import math
import os
import random
import shlex
import signal
import statistics
import sys
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from fractions import Fraction

from chemdata import (DatasetFormatError, Vocab, import_rdkit, quiet_rdkit, canonical_smiles, formula_explicit,
                      parse_formula, rdkit_available, sha256_of, tokenize_formula, tokenize_smiles)
from property_features import randomized_smiles
from safe_io import PartialFile, check_output, resolve_target, write_json

__all__ = ["PredictorFormatError", "PREDICTOR_TOKENIZERS", "PREDICT_STATUSES", "DEFAULT_MAX_INPUT_TOKENS",
           "DOMAIN_COVERAGE", "LEGACY_SMILES_PREPARATION", "NO_REFERENCE", "prepare_smiles",
           "smiles_preparation_record", "composition_similarity", "domain_reference", "domain_threshold",
           "Prediction", "Predictor", "load_predictor", "MAX_LINE_BYTES", "CHUNK_SECONDS", "PROGRESS_MIN_ROWS",
           "MAX_CACHE", "PredictInterrupted", "predict_chunks", "predict_csv", "add_predict_command",
           "conformal_quantile", "interval_scale", "interval_half_width", "NO_SKILL_NOTE",
           "SKILL_NOTE"]


# =====================================================================================
# 1. The model file's meta, the input statuses and limits
# =====================================================================================

class PredictorFormatError(ValueError):
    """A model file is not a usable property predictor: missing or ill-typed meta fields (each named with
    its value), an unknown tokenizer, a training reference that cannot be read."""


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
    "how_known": "not recorded in the model file; the experiment 6 and 8 demos of that time trained on "
                 "load_esol() / load_hopv() strings as written, and the committed models' train_data_sha256 "
                 "equals the sha256 of exactly those strings for their split"}
"""What a SMILES model file without ``meta['smiles_preparation']`` was trained on (the committed models)."""

NO_REFERENCE = "domain not checked (model file has no training reference)"


def _is_number(value, low=-math.inf, high=math.inf):
    """True for a finite int or float (not a bool) in [low, high]."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def _is_int(value, low):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _meta_problems(meta):
    """What is wrong with a predictor's ``meta`` block, field by field (each with its value): the keys every
    predictor needs, their types and ranges (a finite ``target_std`` > 0, ...), and the optional blocks
    (``smiles_preparation``, ``domain``, ``ensemble``, ``interval``, ``errors``, ``skill``).  An empty list for
    a usable block."""
    missing = [k for k in _PREDICTOR_META_KEYS if k not in meta]
    if missing:
        return [f"not a property predictor, meta lacks {missing}"]
    problems = []
    if meta["tokenizer"] not in PREDICTOR_TOKENIZERS:
        problems.append(f"unknown tokenizer {meta['tokenizer']!r}; known: {sorted(PREDICTOR_TOKENIZERS)}")
    checks = (("target_mean", _is_number(meta["target_mean"]), "a finite number"),
              ("target_std", _is_number(meta["target_std"]) and meta["target_std"] > 0, "a finite number > 0"),
              ("units", isinstance(meta["units"], str) and meta["units"].strip() != "", "a non-empty string"),
              ("task", isinstance(meta["task"], str), "a string"),
              ("max_tokens", meta.get("max_tokens") is None or _is_int(meta["max_tokens"], 2), "null or an int >= 2"),
              ("valid_rmse", meta.get("valid_rmse") is None or _is_number(meta["valid_rmse"], 0),
               "null or a number >= 0"),
              ("formula_style", meta.get("formula_style") in (None, "alphabetical_explicit"),
               "null or 'alphabetical_explicit'"))
    problems += [f"meta.{key} must be {want}, got {meta.get(key)!r}" for key, ok, want in checks if not ok]
    problems += _preparation_problems(meta.get("smiles_preparation"))
    if meta.get("domain") is not None:
        problems += _domain_problems(meta["domain"], meta["tokenizer"])
    for key, check in _OPTIONAL_BLOCKS.items():
        if meta.get(key) is not None:
            problems += check(meta[key], meta)
    return problems


def _preparation_problems(prep):
    """What is wrong with ``meta['smiles_preparation']`` (None: not recorded, fine)."""
    if prep is None:
        return []
    if not isinstance(prep, dict):
        return [f"meta.smiles_preparation must be an object, got {prep!r:.80}"]
    problems = [f"meta.smiles_preparation.{k} must be true or false, got {prep.get(k)!r}"
                for k in ("recorded", "trained_on_canonical") if not isinstance(prep.get(k), bool)]
    if prep.get("recorded") is True and not _is_number(prep.get("canonical_fraction"), 0, 1):
        problems.append(f"meta.smiles_preparation.canonical_fraction must be a number in [0, 1], "
                        f"got {prep.get('canonical_fraction')!r}")
    if prep.get("recorded") is False and not isinstance(prep.get("source"), str):
        problems.append(f"meta.smiles_preparation.source must be a string, got {prep.get('source')!r}")
    stereo = prep.get("stereo_in_training")
    if stereo is not None and not (isinstance(stereo, dict) and all(isinstance(stereo.get(k), bool)
                                                                  for k in ("chiral", "double_bond"))):
        problems.append(f"meta.smiles_preparation.stereo_in_training must be null or "
                        f"{{'chiral': bool, 'double_bond': bool}}, got {stereo!r:.80}")
    return problems


_DOMAIN_KINDS = {"formula": ("composition", {"train_formulas": "a list of formula strings"}),
                 "smiles_atom": ("morgan_tanimoto", {"radius": "an int >= 0", "n_bits": "an int >= 1",
                                                     "train_fingerprints_hex": "a list of hex strings"})}


def _domain_problems(domain, tokenizer):
    """What is wrong with ``meta['domain']`` (the training reference ``domain_reference`` writes): every field
    the predictor reads, present and typed; the reference's contents are decoded at load too."""
    if not isinstance(domain, dict):
        return [f"meta.domain must be an object or null, got {domain!r:.80}"]
    kind, fields = _DOMAIN_KINDS.get(tokenizer, (None, {}))
    if domain.get("kind") != kind:
        return [f"meta.domain.kind must be {kind!r} for tokenizer {tokenizer!r}, got {domain.get('kind')!r}"]
    lengths, threshold = domain.get("token_length_range"), domain.get("threshold")
    ok = {"token_length_range": isinstance(lengths, list) and len(lengths) == 2 and all(_is_int(n, 0) for n in lengths)
          and lengths[0] <= lengths[1],
          "threshold": threshold is None or _is_number(threshold, 0, 1),
          "radius": _is_int(domain.get("radius"), 0), "n_bits": _is_int(domain.get("n_bits"), 1),
          "train_formulas": isinstance(domain.get("train_formulas"), list)
          and all(isinstance(f, str) for f in domain["train_formulas"]),
          "train_fingerprints_hex": isinstance(domain.get("train_fingerprints_hex"), list)
          and all(isinstance(h, str) for h in domain["train_fingerprints_hex"])}
    want = {"token_length_range": "[low, high], two ints 0 <= low <= high", "threshold": "null or a number in [0, 1]",
            **fields}
    return [f"meta.domain.{key} must be {what}, " + (f"got {domain[key]!r:.80}" if key in domain else "missing")
            for key, what in want.items() if not ok[key]]


def _ensemble_problems(ens):
    """What is wrong with ``meta['ensemble']``: k >= 2 member records {seed, epoch, valid_rmse} (the first
    is the file's own ``weights``), k - 1 ``extra_weights`` objects (members 2..k; their names and shapes
    are checked when they are loaded) and a ``spread`` text."""
    if not isinstance(ens, dict):
        return [f"meta.ensemble must be an object or null, got {ens!r:.80}"]
    members, extra = ens.get("members"), ens.get("extra_weights")
    if not (isinstance(members, list) and len(members) >= 2):
        return [f"meta.ensemble.members must be a list of at least 2 member records, got {members!r:.80}"]
    problems = [f"meta.ensemble.members[{i}] must be {{'seed': int, 'epoch': int, 'valid_rmse': number >= 0}}, "
                f"got {m!r:.80}" for i, m in enumerate(members)
                if not (isinstance(m, dict) and _is_int(m.get("seed"), -2 ** 63) and _is_int(m.get("epoch"), 0)
                        and _is_number(m.get("valid_rmse"), 0))]
    if not (isinstance(extra, list) and len(extra) == len(members) - 1 and all(isinstance(w, dict) for w in extra)):
        shown = f"{len(extra)} items" if isinstance(extra, list) else f"{extra!r:.80}"
        problems.append(f"meta.ensemble.extra_weights must be a list of {len(members) - 1} weight objects "
                        f"(members 2..{len(members)}), got {shown}")
    if not isinstance(ens.get("spread"), str):
        problems.append(f"meta.ensemble.spread must be a string, got {ens.get('spread')!r:.80}")
    return problems


_INTERVAL_SCALES = ("constant", "spread", "similarity")


def _interval_problems(interval, meta):
    """What is wrong with ``meta['interval']`` (see ``interval_half_width``): the level in (0, 1), a known
    scale that this file can compute ('spread' needs an ensemble, 'similarity' a domain reference), q and
    offset >= 0 (offset > 0 for 'constant'), n_calibration an int >= 1 and the rule a string."""
    if not isinstance(interval, dict):
        return [f"meta.interval must be an object or null, got {interval!r:.80}"]
    scale = interval.get("scale")
    needs = {"spread": ("ensemble", "an ensemble (meta.ensemble)"),
             "similarity": ("domain", "a training reference (meta.domain)")}
    ok = {"level": _is_number(interval.get("level"), 0, 1) and 0 < interval["level"] < 1,
          "scale": scale in _INTERVAL_SCALES,
          "q": _is_number(interval.get("q"), 0),
          "offset": _is_number(interval.get("offset"), 0) and (scale != "constant" or interval["offset"] > 0),
          "n_calibration": _is_int(interval.get("n_calibration"), 1),
          "rule": isinstance(interval.get("rule"), str)}
    want = {"level": "a number in (0, 1)", "scale": f"one of {list(_INTERVAL_SCALES)}", "q": "a number >= 0",
            "offset": "a number >= 0 (> 0 for scale 'constant')", "n_calibration": "an int >= 1",
            "rule": "a string"}
    problems = [f"meta.interval.{key} must be {want[key]}, got {interval.get(key)!r:.80}"
                for key in want if not ok[key]]
    if scale in needs and meta.get(needs[scale][0]) is None:
        problems.append(f"meta.interval.scale {scale!r} needs {needs[scale][1]}, which this file lacks")
    return problems


def _errors_problems(errors):
    """What is wrong with ``meta['errors']`` (errors measured through this predictor): a ``how`` text and,
    for 'valid' and 'test', n (an int >= 0), rmse and mae (>= 0), r2 (a number or null), coverage (null or
    in [0, 1]) and mean_width (null or >= 0)."""
    if not isinstance(errors, dict):
        return [f"meta.errors must be an object or null, got {errors!r:.80}"]
    problems = [] if isinstance(errors.get("how"), str) else [f"meta.errors.how must be a string, "
                                                              f"got {errors.get('how')!r:.80}"]
    for split in ("valid", "test"):
        block = errors.get(split)
        if not isinstance(block, dict):
            problems.append(f"meta.errors.{split} must be an object, got {block!r:.80}")
            continue
        ok = {"n": _is_int(block.get("n"), 0), "rmse": _is_number(block.get("rmse"), 0),
              "mae": _is_number(block.get("mae"), 0), "r2": block.get("r2") is None or _is_number(block["r2"]),
              "coverage": block.get("coverage") is None or _is_number(block["coverage"], 0, 1),
              "mean_width": block.get("mean_width") is None or _is_number(block["mean_width"], 0)}
        want = {"n": "an int >= 0", "rmse": "a number >= 0", "mae": "a number >= 0", "r2": "null or a number",
                "coverage": "null or a number in [0, 1]", "mean_width": "null or a number >= 0"}
        problems += [f"meta.errors.{split}.{key} must be {want[key]}, got {block.get(key)!r:.80}"
                     for key in want if not ok[key]]
    return problems


def _skill_problems(skill):
    """What is wrong with ``meta['skill']``: ``beats_mean`` true or false and a ``statement`` string (other
    keys are kept as written)."""
    if not isinstance(skill, dict):
        return [f"meta.skill must be an object or null, got {skill!r:.80}"]
    problems = [] if isinstance(skill.get("beats_mean"), bool) else [
        f"meta.skill.beats_mean must be true or false, got {skill.get('beats_mean')!r:.80}"]
    if not isinstance(skill.get("statement"), str):
        problems.append(f"meta.skill.statement must be a string, got {skill.get('statement')!r:.80}")
    return problems


_OPTIONAL_BLOCKS = {"ensemble": lambda block, meta: _ensemble_problems(block),
                    "interval": _interval_problems, "errors": lambda block, meta: _errors_problems(block),
                    "skill": lambda block, meta: _skill_problems(block)}


def conformal_quantile(scores, level):
    """The split-conformal quantile of the calibration ``scores`` (n finite numbers >= 0, e.g. |y - value|
    divided by the interval's scale u + offset) at coverage ``level`` in (0, 1): the k-th smallest score
    with k = ceil((n + 1) * level), 1-based; +inf when k > n (too few scores for that level).  ``level`` is
    read as the decimal it is written as (0.9 is 9/10, not the float just above it), so that
    (n + 1) * level lands on the integer it means.  An interval of half-width that quantile times u + offset
    covers a new exchangeable input's value with probability >= level."""
    if not _is_number(level, 0, 1) or not 0 < level < 1:
        raise ValueError(f"conformal_quantile: level must be a number in (0, 1), got {level!r}")
    values = list(scores)
    bad = [s for s in values if not _is_number(s)]
    if bad:
        raise ValueError(f"conformal_quantile: scores must be finite numbers, got {bad[0]!r} among them")
    rank = math.ceil((len(values) + 1) * Fraction(repr(float(level))))
    return math.inf if rank > len(values) else sorted(values)[rank - 1]


def interval_scale(kind, spread, similarity):
    """The scale u of an interval's half-width q * (u + offset) for one input: 0.0 for 'constant', the
    members' ``spread`` for 'spread', 1 - ``similarity`` (to the nearest training input) for 'similarity';
    None when that quantity is None (no interval then).  ValueError for another kind."""
    if kind == "constant":
        return 0.0
    if kind == "spread":
        return None if spread is None else float(spread)
    if kind == "similarity":
        return None if similarity is None else 1.0 - similarity
    raise ValueError(f"interval scale must be one of {list(_INTERVAL_SCALES)}, got {kind!r}")


def interval_half_width(interval_meta, spread, similarity):
    """Half the width of an input's interval, q * (u + offset) with u = ``interval_scale(interval_meta
    ['scale'], spread, similarity)`` and q, offset from ``interval_meta`` (a model file's
    ``meta['interval']``); None when u is None.  The interval is value - half .. value + half."""
    u = interval_scale(interval_meta["scale"], spread, similarity)
    return None if u is None else interval_meta["q"] * (u + interval_meta["offset"])


# =====================================================================================
# 2. Preparing a SMILES: canonical form, stereo, the training data's spelling
# =====================================================================================

def _stereo_kinds(tokens):
    """Which stereo marks occur in ``tokens``: {'chiral': '@' in a bracket atom, 'double_bond': / or \\}."""
    tokens = list(tokens)
    return {"chiral": any("@" in t for t in tokens), "double_bond": any(t in ("/", "\\") for t in tokens)}


def _mol_without_stereo(mol, keep):
    """Remove from an RDKit molecule (in place) the stereo kinds not in ``keep``; True if any was there."""
    Chem = import_rdkit()
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
    Chem = import_rdkit()
    with quiet_rdkit():
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


def _canonical_tokens(smiles, canonical, known_tokens=None):
    """(string, tokens) the model reads for the user's ``smiles`` whose RDKit canonical form is
    ``canonical``: that form, rewritten into the training files' spelling (``_in_training_style``) when
    ``known_tokens`` is given (the vocabulary of a model trained on SMILES as written).  A ValueError quotes
    the user's string first, the canonical form only as context (it is a string the user never typed)."""
    try:
        if known_tokens is not None:
            canonical = _in_training_style(canonical, known_tokens)
        return canonical, tokenize_smiles(canonical)
    except ValueError as e:
        raise ValueError(f"cannot tokenize the RDKit canonical form of {smiles!r} (that form is {canonical!r}: "
                         f"{e})") from None


def smiles_preparation_record(train_smiles):
    """The ``meta['smiles_preparation']`` a SMILES model file records: whether its training SMILES were
    RDKit-canonical (and the fraction that were), which stereo marks they held, and how inputs are prepared."""
    import_rdkit()
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
    Chem = import_rdkit()
    with quiet_rdkit():
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
    read (the RDKit canonical SMILES) and ``similarity`` to the nearest training input (None if unknown).
    An ensemble file's ``value`` is the mean of its members' values and ``spread`` their sample standard
    deviation (None for a single model); ``low`` .. ``high`` is the model file's calibrated interval around
    the value (None when the file has none, or it cannot be computed for this input)."""
    input: str
    value: object
    status: str
    reason: str = ""
    n_unk: int = 0
    domain: str = "not checked"
    prepared: str = ""
    similarity: object = None
    spread: object = None
    low: object = None
    high: object = None


def _positive_int(name, value, minimum):
    """``value`` if it is an int >= ``minimum``, else ValueError/TypeError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def _input_strings(inputs):
    """``inputs`` as a list of strings.  TypeError for a single str or bytes (a list of one is meant) and
    for items that are not strings, each named by its index and type (at most five, then a count)."""
    if isinstance(inputs, (str, bytes, bytearray)):
        raise TypeError(f"inputs must be a list of strings, got a single {type(inputs).__name__} {inputs!r:.60}; "
                        f"for one input write [{inputs!r:.60}]")
    try:
        items = list(inputs)
    except TypeError:
        raise TypeError(f"inputs must be a list of strings, got {type(inputs).__name__} {inputs!r:.60}") from None
    bad = [f"item {i} is {type(x).__name__} {x!r:.40}" for i, x in enumerate(items) if not isinstance(x, str)]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise TypeError("inputs must be strings: " + ", ".join(bad[:5]) + more)
    return items


NO_SKILL_NOTE = "no better than predicting the training mean on test"
"""The note every predicted row's reason carries when the model file's ``meta['skill']['beats_mean']`` is false."""

SKILL_NOTE = "beats predicting the training mean on test (paired)"
"""The note every predicted row's reason carries when ``meta['skill']['beats_mean']`` is true: a file with a skill
verdict says, on every row, whether its model beats the mean."""


def _ensemble_size(meta):
    """How many models a model file holds: the ensemble's members, or 1."""
    return len(meta["ensemble"]["members"]) if meta.get("ensemble") else 1


class Predictor:
    """A saved TransformerEncoder with everything needed to use it on new molecules or formulas.

    ``predict(inputs)`` -> list of floats (None where an input cannot be predicted);
    ``predict_detailed(inputs)`` -> list of ``Prediction`` with the status, domain and reason of each input;
    ``inputs`` is a list of strings, each distinct one predicted once (``workers=N``: on N processes).
    The model file's meta is checked whole when the predictor is made (PredictorFormatError).
    A SMILES is read as its RDKit canonical form (stereo marks the training data never had removed), so
    every spelling of a molecule gets the same prediction; ``n_random`` > 0 averages the model over that
    form and ``n_random`` random spellings of it (fixed seed: still one prediction per molecule).  Inputs
    over ``max_input_tokens`` tokens are refused at once.  One bad input never stops the others.
    ``model`` is one model, or a list of the first members of the file's ensemble (``members``): each input's
    value is their mean, with their spread; the interval of ``meta['interval']`` is given only when every
    member of the file is used (it was calibrated for the whole ensemble)."""

    def __init__(self, model, meta, path="", max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, n_random=0):
        problems = _meta_problems(meta) if isinstance(meta, dict) else [f"meta must be an object, got {meta!r:.80}"]
        if problems:
            raise PredictorFormatError(f"{path}: " + "; ".join(problems))
        self.members = list(model) if isinstance(model, (list, tuple)) else [model]
        self.n_file_members = _ensemble_size(meta)
        if not 1 <= len(self.members) <= self.n_file_members:
            raise ValueError(f"{len(self.members)} models given, the model file holds {self.n_file_members}")
        self.model, self.meta, self.path = self.members[0], meta, path
        self.interval = meta.get("interval") if len(self.members) == self.n_file_members else None
        skill = meta.get("skill")
        self.beats_mean = (skill or {}).get("beats_mean", True)
        self.skill_note = None if skill is None else SKILL_NOTE if self.beats_mean else NO_SKILL_NOTE
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
        self._train, self._warm = None, False
        if self.reference is not None:
            try:                                        # decoded now: a broken reference is the file's fault
                self._train_reference()
            except (TypeError, ValueError) as e:
                field = "train_formulas" if self.reference["kind"] == "composition" else "train_fingerprints_hex"
                raise PredictorFormatError(f"{path}: meta.domain.{field} holds an unreadable training reference "
                                           f"({e})") from None

    def _prepare(self, text):
        """(string the model reads, its tokens, notes, validity 'valid'/'invalid'/'unchecked');
        raises ValueError when the input cannot be predicted (empty, untokenisable, too long)."""
        text = text.strip()
        if not text:
            raise ValueError("empty input")
        notes, validity = [], "valid"
        if self.meta.get("formula_style") == "alphabetical_explicit":
            rewritten = formula_explicit(text)
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
                known = None if self.preparation["trained_on_canonical"] else self.vocab.stoi
                text, tokens = _canonical_tokens(text, canonical, known)
                if removed:
                    notes.append("stereo ignored (the training data had no such marks)")
        return text, tokens, notes, validity

    def _ids(self, tokens):
        """(token ids the model reads, tokens unseen in training, whether they were cut to max_tokens)."""
        before = self.vocab.unk_count
        ids = self.vocab.encode(tokens)
        n_unk = self.vocab.unk_count - before
        cut = bool(self.max_tokens) and len(ids) > self.max_tokens
        if cut:
            ids = ids[:self.max_tokens - 1] + [self.vocab.eos_id]
        return ids, n_unk, cut

    def _value(self, text, tokens, validity, notes):
        """(prediction in the target's units, n_unk, spread): each member's value is one forward, or the mean
        over the canonical and n_random spellings; the prediction is the members' mean, the spread their
        sample standard deviation (None for one model)."""
        ids, n_unk, cut = self._ids(tokens)
        if cut:
            notes.append(f"cut to {self.max_tokens} tokens as in training")
        sequences = [ids]
        if self.n_random and self.is_smiles and validity == "valid":
            spellings = randomized_smiles(text, self.n_random, random.Random(0))
            sequences += [self._ids(tokenize_smiles(s))[0] for s in spellings]
            notes.append(f"mean over the canonical and {self.n_random} random SMILES")
        values = []
        for model in self.members:
            zs = [model.forward(seq)[0] for seq in sequences]
            z = zs[0] if len(zs) == 1 else sum(zs) / len(zs)
            values.append(z * self.meta["target_std"] + self.meta["target_mean"])
        if len(values) == 1:
            return values[0], n_unk, None
        return sum(values) / len(values), n_unk, statistics.stdev(values)

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
        Chem = import_rdkit()
        with quiet_rdkit():
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

    def interval_of(self, value, spread, similarity):
        """(low, high) of an input's interval around ``value`` (``interval_half_width``), or (None, None):
        no interval in the file, fewer members used than it holds, no value, or the scale not computable."""
        if self.interval is None or value is None:
            return None, None
        half = interval_half_width(self.interval, spread, similarity)
        return (None, None) if half is None else (value - half, value + half)

    def _one(self, text):
        """The ``Prediction`` of one input; raises ValueError when it cannot be predicted."""
        prepared, tokens, notes, validity = self._prepare(text)
        value, n_unk, spread = self._value(prepared, tokens, validity, notes)
        domain, reasons, sim = self._domain(prepared, tokens, n_unk, validity)
        if validity == "invalid":
            status = "invalid"
        elif domain == "out":
            status = "out_of_domain"
        else:
            status = "ok" if validity == "valid" and domain == "in" else "unchecked"
        notes = notes[:1] + reasons + notes[1:] if validity != "valid" else reasons + notes
        if self.skill_note:
            notes.append(self.skill_note)
        low, high = self.interval_of(value, spread, sim)
        return Prediction(str(text), value, status, "; ".join(notes), n_unk, domain, prepared, sim, spread, low, high)

    def _outcome(self, text):
        """The ``Prediction`` of one input string; one that cannot be predicted gets status 'error'."""
        try:
            return self._one(text)
        except ValueError as e:
            return Prediction(text, None, "error", str(e))
        except Exception as e:                # never let one input stop the others
            return Prediction(text, None, "error", f"{type(e).__name__}: {e}")

    def outcomes(self, texts, workers=1):
        """{text: Prediction} for the distinct strings ``texts``, computed on ``workers`` forked processes
        (``transformer.parallel_map``; the same values as one process: each input's computation does not
        depend on the others or on the worker), longest first so that the workers finish together."""
        order = sorted(set(texts), key=len, reverse=True)
        done = {}
        if _positive_int("workers", workers, 1) > 1 and len(order) > 1:
            import transformer
            if not self._warm:        # lazy imports (RDKit: ~0.7 s) once here, not in every forked worker
                first = order.pop(0)
                done[first] = self._outcome(first)
                self._warm = True
            results = transformer.parallel_map(lambda text, rng: self._outcome(text), order, workers=workers)
        else:
            results = [self._outcome(text) for text in order]
        done.update(zip(order, results))
        return done

    def predict_detailed(self, inputs, workers=1):
        """A ``Prediction`` per input, in order; an input that cannot be predicted gets status 'error'.
        ``inputs`` is a list (or other iterable) of strings: a single string is a TypeError (it would be
        read as one input per character), and so is any item that is not a string (named by its index and
        type).  Each distinct string is predicted once; ``workers`` > 1 shares them out over that many
        processes (see ``outcomes``)."""
        items = _input_strings(inputs)
        results = self.outcomes(items, workers)
        return [replace(results[text]) for text in items]

    def predict(self, inputs, workers=1):
        """Values in the target's units, None where an input could not be predicted (``inputs`` as for
        ``predict_detailed``)."""
        return [p.value for p in self.predict_detailed(inputs, workers)]

    def _describe_errors(self):
        """The measured errors (``meta['errors']``), or the old file's validation RMSE as a rough uncertainty."""
        errors = self.meta.get("errors")
        if errors is None:
            rmse = self.meta.get("valid_rmse")
            return (f"validation RMSE {rmse:.3g} {self.units} (a rough uncertainty)" if rmse is not None
                    else "validation RMSE not recorded")
        valid, test = errors["valid"], errors["test"]
        r2 = f" (R\u00b2 {test['r2']:.2f})" if test.get("r2") is not None else ""
        whole = (f" (of all {self.n_file_members} models; {len(self.members)} used here)"
                 if len(self.members) < self.n_file_members else "")
        return (f"validation RMSE {valid['rmse']:.3g}, test RMSE {test['rmse']:.3g} {self.units}{r2}, measured "
                f"through this predictor on the split's molecules{whole}")

    def _describe_members(self):
        """'single model' or 'mean of k models (seeds ...)', saying when only part of the file's ensemble is used."""
        records = (self.meta.get("ensemble") or {}).get("members", [])
        seeds = ", ".join(str(m["seed"]) for m in records[:len(self.members)])
        if len(self.members) == 1:
            return (f"single model (the first of the file's {self.n_file_members}, seed {seeds})"
                    if self.n_file_members > 1 else "single model")
        part = f" of the file's {self.n_file_members}" if len(self.members) < self.n_file_members else ""
        return f"mean of {len(self.members)}{part} models (seeds {seeds})"

    def _describe_interval(self):
        """The interval the rows get (level, how it is scaled, its measured test coverage), or 'no interval'."""
        if self.meta.get("interval") is None:
            return "no interval"
        if self.interval is None:
            return f"no interval (calibrated for all {self.n_file_members} models, {len(self.members)} used)"
        scaled = {"constant": "of constant width", "spread": "scaled by the ensemble spread",
                  "similarity": "scaled by 1 - similarity to the nearest training input"}[self.interval["scale"]]
        coverage = ((self.meta.get("errors") or {}).get("test") or {}).get("coverage")
        covered = f" (test coverage {coverage:.0%})" if coverage is not None else ""
        return f"{self.interval['level'] * 100:g} % split-conformal interval, {scaled}{covered}"

    def describe(self):
        """One line of context: model file, target and units, the measured errors (or validation RMSE), the
        ensemble, the interval, the skill, input preparation, domain and input limit."""
        parts = [f"model {self.path}: {self.task} in {self.units}", self._describe_errors(),
                 self._describe_members(), self._describe_interval()]
        if self.skill_note:
            parts.append(self.skill_note)
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


def _ensemble_models(first, meta, path, max_members):
    """The file's own model ``first`` and the members 2..k of its ensemble block (each the file's config
    with ``extra_weights[i]``, ``transformer.set_weights``), up to ``max_members``.  The weights of every
    member are checked, used or not: PredictorFormatError naming the file and the field."""
    import transformer
    models, scratch = [first], None
    for i, weights in enumerate((meta.get("ensemble") or {}).get("extra_weights", [])):
        keep = max_members is None or len(models) < max_members
        if keep or scratch is None:
            model = type(first)(**first.config)
        else:
            model = scratch                                  # checked, then dropped
        try:
            transformer.set_weights(model, weights, f"{path} member {i + 2}")
        except transformer.ModelFormatError as e:
            raise PredictorFormatError(f"{path}: meta.ensemble.extra_weights[{i}] are not the weights of "
                                       f"member {i + 2}: {e}") from None
        if keep:
            models.append(model)
        else:
            scratch = model
    return models


def load_predictor(path, max_members=None, **options):
    """Load a model file written by the property demos (``models/*.json``) as a ``Predictor``: every member
    of its ensemble (``meta['ensemble']``), or the first ``max_members`` of them (``max_members=1``: the
    file's own weights only; the file's interval is then not given).  ``options`` (max_input_tokens,
    n_random) go to ``Predictor``."""
    import transformer
    if max_members is not None:
        _positive_int("max_members", max_members, 1)
    meta = _predictor_meta(path)
    first = transformer.load_model(path)
    problems = _meta_problems(meta)
    if problems:                             # before the ensemble's weights are read
        raise PredictorFormatError(f"{path}: " + "; ".join(problems))
    return Predictor(_ensemble_models(first, meta, path, max_members), meta, path, **options)


# =====================================================================================
# 5. Files: read in bounded memory, predicted in chunks, streamed out in order, resumable
# =====================================================================================
#
# One pipeline:  read (_scan_csv, then _csv_records: a stream of records, never the whole file)
#             -> dedupe (predict_chunks: each distinct input once, in chunks of about CHUNK_SECONDS)
#             -> predict in parallel (Predictor.outcomes on forked workers, identical to one process)
#             -> stream out in input order (each chunk's rows appended to <out>.partial, flushed, fsync'ed;
#                renamed over --out at the end; an interrupted run is finished by the same command plus
#                --resume, which checks the partial file against the input, the model and the options).

MAX_LINE_BYTES = 8 * 2 ** 20
"""A CSV line longer than this (8 MiB) is refused with its line number and byte offset: no molecule needs
it, and reading one would hold it whole in memory."""

CHUNK_SECONDS = 2.0
"""The pipeline predicts about this many seconds of new inputs at a time (measured as it goes), then writes
their rows: an interruption loses at most one chunk of work."""

PROGRESS_MIN_ROWS = 200
"""Files with more data rows than this get a progress line with an ETA on stderr after every chunk."""

MAX_CACHE = 100_000
"""At most this many distinct inputs' predictions are kept for reuse (the oldest go first); a repeat
further apart than that is predicted again, with the same result."""

_MAX_WINDOW_ROWS = 10_000     # rows held before a chunk is written, whatever the number of new inputs


class PredictInterrupted(KeyboardInterrupt):
    """A prediction run stopped by Ctrl-C (SIGINT) or SIGTERM after ``rows_done`` of ``total`` data rows;
    every finished row is in ``partial`` (None when the rows went to a stream)."""

    def __init__(self, signal_name, rows_done, total, partial, complete=None):
        super().__init__(f"{signal_name} after {rows_done} of {total} rows")
        self.signal_name, self.rows_done, self.total, self.partial = signal_name, rows_done, total, partial
        self.complete = complete
        """The finished output's path when the signal came after every row was written (nothing to resume)."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main process so it unwinds like Ctrl-C."""


_STOP_SIGNALS = []
"""Signals that asked the running command to stop (``_stop_on_signals`` records them).  The handler also
raises at once, but an exception raised inside an at-fork hook (a signal landing while ``parallel_map``
forks) is only printed by Python, so the pipeline checks this list after every chunk."""


def _raise_if_stopped():
    """Raise the interrupt a lost exception stood for (see _STOP_SIGNALS)."""
    if _STOP_SIGNALS:
        raise _Terminated() if _STOP_SIGNALS[-1] == signal.SIGTERM else KeyboardInterrupt()


def _scan_csv(path):
    """(encoding, note) of a CSV file, read once in 1 MiB pieces (bounded memory): 'utf-8-sig' when it is
    UTF-8 (a BOM is dropped), else 'latin-1' with a note naming the first line that is not UTF-8 (Latin-1
    decodes every byte).  Refuses at the first offending byte, with DatasetFormatError naming the file and
    the byte offset: a NUL byte (a binary file, not text) or a line over MAX_LINE_BYTES; and anything but a
    regular file (it is read twice)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise DatasetFormatError(f"{path} is not a regular file (a CSV file is read twice: a pipe cannot be)")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, newlines, open_line, bad_line = 0, 0, 0, None
    with open(path, "rb") as f:
        while chunk := f.read(2 ** 20):
            nul = chunk.find(b"\0")
            if nul >= 0:
                line = newlines + chunk.count(b"\n", 0, nul) + 1
                raise DatasetFormatError(f"{path}: NUL byte at byte offset {offset + nul} (line {line}): "
                                         "a binary file, not CSV text")
            open_line = _open_line_length(path, chunk, offset, newlines, open_line)
            if bad_line is None:
                bad_line = _first_bad_utf8_line(decoder, chunk, newlines)
            newlines += chunk.count(b"\n")
            offset += len(chunk)
    if bad_line is None:
        bad_line = _first_bad_utf8_line(decoder, b"", newlines, final=True)
    if bad_line is None:
        return "utf-8-sig", ""
    return "latin-1", f"{path} is not UTF-8 (line {bad_line} first); read as Latin-1"


def _first_bad_utf8_line(decoder, chunk, newlines, final=False):
    """The line number of the first byte of ``chunk`` that is not UTF-8 (``decoder`` carries a sequence cut
    at the previous chunk's end; those bytes hold no newline), else None."""
    carried = len(decoder.getstate()[0])
    try:
        decoder.decode(chunk, final)
    except UnicodeDecodeError as e:
        return newlines + chunk.count(b"\n", 0, max(0, e.start - carried)) + 1
    return None


def _open_line_length(path, chunk, offset, newlines, open_line):
    """The length of the line still open after ``chunk`` (``open_line`` bytes of it came before); refuses a
    line over MAX_LINE_BYTES with its number and byte offset."""
    lengths = [len(piece) for piece in chunk.split(b"\n")]
    lengths[0] += open_line
    longest = max(lengths)
    if longest > MAX_LINE_BYTES:
        i = lengths.index(longest)
        start = offset - open_line if i == 0 else offset + sum(lengths[1:i]) + lengths[0] - open_line + i
        raise DatasetFormatError(f"{path}: line {newlines + i + 1} (from byte offset {start}) is longer than "
                                 f"{MAX_LINE_BYTES // 2 ** 20} MiB: not a CSV file of inputs")
    return lengths[-1]


def _csv_records(path, encoding):
    """(line number, fields or None, csv error) for every record of the file, read as a stream; a record
    the csv module cannot parse gives its error instead of stopping the rest."""
    with open(path, encoding=encoding, newline="") as f:
        if encoding == "latin-1" and f.read(3) != "\xef\xbb\xbf":     # a UTF-8 BOM before Latin-1 text
            f.seek(0)
        reader = csv.reader(f)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield reader.line_num, None, str(e)
                continue
            yield reader.line_num, row, ""


def _csv_job(record, n_fields, col):
    """A data record as (payload, item): payload = (the record's fields padded or cut to the header's
    count, a note for the reason); item = the input string, or the error ``Prediction`` of a record that is
    unparsable, empty, or longer than the header (not predicted: its columns would not line up)."""
    number, row, error = record
    if row is None:
        return ([""] * n_fields, ""), Prediction("", None, "error", f"line {number}: {error}")
    fields = row[:n_fields] + [""] * (n_fields - len(row))
    if not any(field.strip() for field in row):
        return (fields, ""), Prediction("", None, "error", f"line {number} is empty")
    if len(row) > n_fields:
        extra = ",".join(row[n_fields:])[:60]
        return (fields, ""), Prediction(row[col], None, "error",
                                        f"line {number} has {len(row)} fields, the header {n_fields}: not "
                                        f"predicted, columns would not line up (extra: {extra!r})")
    note = f"line {number} has {len(row)} fields, the header {n_fields}" if len(row) < n_fields else ""
    return (fields, note), fields[col]


def _csv_text(rows, delimiter=","):
    """``rows`` as CSV (or, with a tab, TSV) text, one record per line ending in "\\n": a field holding the
    delimiter, a double quote or a line break is quoted ("..." with "" for a quote, RFC 4180), so every row
    reads back as written; a row holding a carriage return is quoted whole (Python's writer would not)."""
    buf = io.StringIO()
    plain = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    quoted = csv.writer(buf, delimiter=delimiter, lineterminator="\n", quoting=csv.QUOTE_ALL)
    for row in rows:
        (quoted if any("\r" in field for field in row) else plain).writerow(row)
    return buf.getvalue()


_ADDED_COLUMNS = ("low", "high", "spread", "status", "domain", "reason")
_STATUS_COLUMN = 4            # the status is the 5th added column: prediction_<units>, low, high, spread, status


def _output_header(units):
    """The seven columns a prediction adds: prediction_<units>, low, high, spread, status, domain, reason."""
    return [f"prediction_{units}", *_ADDED_COLUMNS]


def _output_fields(res, value_format):
    """The seven columns a prediction adds: value, low, high, spread (each empty where None, written with
    ``value_format``), status, domain (empty for an error), reason."""
    numbers = ["" if x is None else format(x, value_format) for x in (res.value, res.low, res.high, res.spread)]
    return numbers + [res.status, res.domain if res.status != "error" else "", res.reason]


def predict_chunks(predictor, jobs, workers=1):
    """The pipeline's middle: ``jobs`` yields (payload, item), item an input string or an already decided
    ``Prediction``; yields lists of (payload, Prediction) in input order, one per chunk.  A chunk is cut
    when it holds about CHUNK_SECONDS of inputs not predicted before in this run (measured as it goes) or
    _MAX_WINDOW_ROWS rows; each distinct input is predicted once (the last MAX_CACHE are kept for repeats),
    on ``workers`` processes.  A repeat gets the same ``Prediction`` object: copy it to change it."""
    cache, window, new, size = OrderedDict(), [], set(), 4 * workers
    for payload, item in jobs:
        window.append((payload, item))
        if isinstance(item, str) and item not in cache:
            new.add(item)
        if len(new) >= size or len(window) >= _MAX_WINDOW_ROWS:
            size = _predict_into(predictor, cache, new, workers, size)
            yield _resolved(window, cache)
            window, new = [], set()
    if window:
        _predict_into(predictor, cache, new, workers, size)
        yield _resolved(window, cache)


def _resolved(window, cache):
    """The window's (payload, Prediction) pairs; then the oldest predictions beyond MAX_CACHE are dropped."""
    done = [(payload, cache[item] if isinstance(item, str) else item) for payload, item in window]
    while len(cache) > MAX_CACHE:
        cache.popitem(last=False)
    return done


def _predict_into(predictor, cache, new, workers, size):
    """Predict the inputs ``new`` into ``cache``; returns the next chunk size: CHUNK_SECONDS at the rate
    just measured, between 2 per worker and 4,096."""
    if not new:
        return size
    t0 = time.perf_counter()
    cache.update(predictor.outcomes(new, workers))
    elapsed = time.perf_counter() - t0
    rate = len(new) / max(elapsed, 1e-6)
    return max(2 * workers, min(4096, int(rate * CHUNK_SECONDS)))


def _run_record(predictor, in_path, column):
    """What a resumed run must share with the interrupted one (kept in ``<out>.partial.json``): the input's
    and the model file's sha256, the column, and the options that change predictions (for an ensemble
    file, also the number of members used)."""
    model = predictor.path if predictor.path and os.path.isfile(predictor.path) else None
    return {"about": "predict --csv ... --out: the run whose rows <out>.partial holds; --resume checks it",
            "input_sha256": sha256_of(in_path), "model_sha256": sha256_of(model) if model else None,
            "column": column, "max_input_tokens": predictor.max_input_tokens, "n_random": predictor.n_random,
            **({"members": len(predictor.members)} if predictor.n_file_members > 1 else {})}


def _check_resumable(sidecar, record, partial):
    """Refuse to resume ``partial`` unless its run record matches this run's (input, model, options)."""
    try:
        with open(sidecar, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise DatasetFormatError(f"--resume: cannot read {sidecar}, the record of the run that wrote {partial} "
                                 f"({type(e).__name__}): remove {partial} to start again") from None
    if record["model_sha256"] is None:
        raise DatasetFormatError("--resume needs a predictor loaded from a model file (its sha256 is checked)")
    differ = [k for k in record if k != "about" and (saved.get(k) if isinstance(saved, dict) else None) != record[k]]
    if differ:
        raise DatasetFormatError(f"--resume: {partial} was written from another {', '.join(differ)} than this "
                                 f"run's: remove it to start again, or give the same input, model and options")


def _data_rows(reader):
    """The rows of a csv reader up to the first one it cannot read (a file cut by a kill)."""
    while True:
        try:
            yield next(reader)
        except (StopIteration, csv.Error, UnicodeDecodeError):
            return


def _verified_prefix(partial, records, out_header, n_fields):
    """(bytes to keep, rows kept, counts by status) of an interrupted run's partial file: it must start with
    this run's header (or a piece of it: nothing kept); then each row must hold the fields of the input's
    record at its place (``records``: the data records), a known status and nothing more, and end with its
    newline.  The longest such prefix is kept; the rest (a row cut by a kill) is dropped."""
    size, header = os.path.getsize(partial), _csv_text([out_header]).encode("utf-8")
    with open(partial, "rb") as f:
        start = f.read(len(header))
    if start != header:
        if header.startswith(start):
            return 0, 0, Counter()
        raise DatasetFormatError(f"--resume: {partial} does not start with this run's header {out_header}: "
                                 "remove it to start again")
    keep, rows, counts = len(header), 0, Counter()
    with open(partial, encoding="utf-8", newline="") as f:
        written_rows = _data_rows(csv.reader(f))
        next(written_rows, None)                                 # the header, checked above
        for written in written_rows:
            record = next(records, None)
            complete = len(written) == n_fields + 1 + len(_ADDED_COLUMNS)
            status = written[n_fields + _STATUS_COLUMN] if complete else None
            if (record is None or status not in PREDICT_STATUSES
                    or written[:n_fields] != _csv_job(record, n_fields, 0)[0][0]):
                break
            line = len(_csv_text([written]).encode("utf-8"))
            if keep + line > size:
                break
            keep, rows = keep + line, rows + 1
            counts[status] += 1
    return keep, rows, counts


def _open_partial(predictor, in_path, column, out_path, resume, layout):
    """(PartialFile, rows already done, their counts by status, notes) for ``--out``: the target, the
    partial file and its run record are checked first (``safe_io.check_output``: a regular file or a missing
    name, none of them the input or the model, in a writable folder).  A fresh run refuses to replace
    the partial file of an interrupted one; ``resume`` checks it and keeps its verified rows."""
    encoding, out_header, n_fields = layout
    inputs = [in_path] + ([predictor.path] if predictor.path else [])
    target = check_output(out_path, inputs=inputs)
    partial, sidecar = target + ".partial", target + ".partial.json"
    for path in (partial, sidecar):
        check_output(path, inputs=inputs)
    record = _run_record(predictor, in_path, column)
    if not resume:
        if os.path.lexists(partial):
            raise DatasetFormatError(f"{partial} holds the rows of an interrupted run: add --resume to finish "
                                     "it, or remove it to start again")
        write_json(sidecar, record)
        out = PartialFile(out_path)
        out.append(_csv_text([out_header]))
        return out, 0, Counter(), []
    if not os.path.isfile(partial):
        raise FileNotFoundError(f"--resume: there is no {partial} to finish (no interrupted run of this --out)")
    _check_resumable(sidecar, record, partial)
    records = itertools.islice(_csv_records(in_path, encoding), 1, None)
    keep, rows, counts = _verified_prefix(partial, records, out_header, n_fields)
    dropped = os.path.getsize(partial) - keep
    out = PartialFile(out_path, keep=keep)
    if keep == 0:
        out.append(_csv_text([out_header]))
    return out, rows, counts, [f"resumed {partial}: {rows} finished rows checked against the input and kept"
                               + (f", {dropped} bytes after them dropped (a row cut short)" if dropped else "")]


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait until the block ends, so that a chunk's rows are written and counted together
    (POSIX, main thread; elsewhere nothing is held)."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _seconds(t):
    return f"{t:.0f} s" if t < 120 else f"{t / 60:.1f} min" if t < 7200 else f"{t / 3600:.1f} h"


def _write_rows(predictor, jobs, write, done, total, workers, progress):
    """Predict ``jobs`` (``predict_chunks``) and ``write`` each chunk's rows as CSV text, in input order;
    after each chunk a progress line with an ETA goes to ``progress`` (a text stream) when the file has over
    PROGRESS_MIN_ROWS rows.  Returns (rows done, counts by status of this run's rows); Ctrl-C or SIGTERM
    raises PredictInterrupted with the number of rows written."""
    counts, start, t0 = Counter(), done, time.perf_counter()
    try:
        for chunk in predict_chunks(predictor, jobs, workers):
            rows = []
            for (fields, note), res in chunk:
                if note:
                    res = replace(res, reason=note + (f"; {res.reason}" if res.reason else ""))
                rows.append(fields + _output_fields(res, ".6g"))
                counts[res.status] += 1
            with _signals_held():
                write(_csv_text(rows))
                done += len(rows)
            _raise_if_stopped()
            if progress is not None and total > PROGRESS_MIN_ROWS:
                elapsed = time.perf_counter() - t0
                eta = elapsed / (done - start) * (total - done)
                print(f"predict: {done}/{total} rows ({done / total:.0%}), {_seconds(elapsed)} elapsed, "
                      f"ETA {_seconds(eta)}", file=progress, flush=True)
    except KeyboardInterrupt as e:
        raise PredictInterrupted("SIGTERM" if isinstance(e, _Terminated) else "SIGINT", done, total, None) from None
    return done, counts


def _csv_layout(in_path, column):
    """(encoding, note, header fields as written, column index, number of data records) of a CSV file:
    scanned (``_scan_csv``) and read as a stream; DatasetFormatError when ``column`` is not in the header."""
    encoding, note = _scan_csv(in_path)
    records = _csv_records(in_path, encoding)
    first = next(records, None)
    header = first[1] if first and first[1] else []
    names = [h.strip() for h in header]
    if column not in names:
        raise DatasetFormatError(f"{in_path} has no column {column!r} (its columns: {names!r:.300})")
    return encoding, note, header, names.index(column), sum(1 for _ in records)


def _finish_output(sink, done, total):
    """Rename the complete ``<out>.partial`` over the output and drop its run record, Ctrl-C and SIGTERM
    held meanwhile; one that arrived then is raised as PredictInterrupted with ``complete`` set (every row
    is written, nothing to resume)."""
    try:
        with _signals_held():
            sink.finish()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sink.target + ".partial.json")
    except KeyboardInterrupt as e:
        name = "SIGTERM" if isinstance(e, _Terminated) else "SIGINT"
        raise PredictInterrupted(name, done, total, None, complete=sink.target) from None


def predict_csv(predictor, in_path, column, out_path=None, *, workers=1, resume=False, progress=None,
                stream=None):
    """Add ``prediction_<units>``, ``low``, ``high``, ``spread``, ``status``, ``domain`` and ``reason`` columns
    (``_output_fields``) to every row of a CSV file.

    Read as UTF-8 (BOM dropped), else Latin-1 (stated), as a stream (``_scan_csv`` first refuses a binary
    file, naming the byte offset).  Every record after the header is kept, in order, with the header's
    number of fields; a row that is empty, ragged or unparsable gets an empty prediction and its line
    number.  Each distinct input is predicted once, on ``workers`` processes.  The rows go, chunk by
    chunk, to ``out_path`` through ``<out_path>.partial`` (renamed over it at the end; ``resume=True``
    finishes an interrupted run, see ``_open_partial``), or to ``stream``, or into the returned text.
    ``progress``: a text stream for the notes (as they arise) and progress lines.  Returns (out_path, or
    the text, or None when streamed; counts by status; notes); Ctrl-C or SIGTERM raises PredictInterrupted
    (every finished row kept in the partial file)."""
    if resume and out_path is None:
        raise ValueError("resume needs out_path (the output whose .partial file an interrupted run left)")
    if out_path is not None:                   # refuse an unusable output before reading anything
        check_output(out_path, inputs=[in_path] + ([predictor.path] if predictor.path else []))
    encoding, note, header, col, total = _csv_layout(in_path, column)
    out_header = header + _output_header(predictor.units)
    notes, done, counts, sink = [note] if note else [], 0, Counter(), io.StringIO()
    if out_path is not None:
        sink, done, counts, resumed = _open_partial(predictor, in_path, column, out_path, resume,
                                                    (encoding, out_header, len(header)))
        notes += resumed
    elif stream is not None:
        sink = stream
    if out_path is None:
        sink.write(_csv_text([out_header]))
    for line in notes if progress is not None else ():
        print(f"predict: {line}", file=progress, flush=True)
    records = itertools.islice(_csv_records(in_path, encoding), 1 + done, None)
    jobs = (_csv_job(record, len(header), col) for record in records)
    write = sink.append if out_path is not None else (lambda text: (sink.write(text), sink.flush()))
    try:
        done, new_counts = _write_rows(predictor, jobs, write, done, total, workers, progress)
    except PredictInterrupted as e:
        e.partial = sink.partial if out_path is not None else None
        raise
    finally:
        if out_path is not None:
            sink.close()                  # kept on any failure: --resume finishes it
    if out_path is not None:
        _finish_output(sink, done, total)
    counts.update(new_counts)
    return out_path if out_path is not None else sink.getvalue() if stream is None else None, dict(counts), notes


# =====================================================================================
# 6. The predict command (python chemdata.py predict ...; chemdata.main dispatches)
# =====================================================================================

_PREDICT_EPILOG = f"""\
output:
  Inputs on the command line: a context line (# model ...: the measured errors, the ensemble, the
  interval), a header row and one tab-separated line per input (input, prediction_<units>, low, high,
  spread, status, domain, reason).  --csv: the CSV file with those seven columns added to every row, to
  standard output or --out.  low and high bound the model file's calibrated interval (empty without
  one), spread is the ensemble members' standard deviation (empty for a single model); a model no better
  than the training mean on its test split says so in every row's reason.  Both are written with CSV
  quoting (RFC 4180: a field holding the delimiter, a double quote or a line break is put in double
  quotes, a quote doubled), so an input holding a tab or a newline stays one field; any CSV/TSV reader
  reads them back.

large files (--csv):
  The file is read as a stream (a binary file, or a line over {MAX_LINE_BYTES // 2 ** 20} MiB, is refused at
  once with its byte offset).  Each distinct input is predicted once, on --workers processes (the same
  values as one process).  Over {PROGRESS_MIN_ROWS} rows, a progress line with an ETA goes to stderr after
  each chunk (about {CHUNK_SECONDS:g} s of predictions).  --out is checked before any work: a regular file
  or a new name in an existing, writable folder, neither the input nor the model (a device, a FIFO, a
  link to one is refused).  The finished rows are appended, in input order, to OUT.partial beside OUT
  (flushed to disk after each chunk) and OUT.partial.json records the input's and the model's sha256
  and the options; at the end OUT.partial is renamed over OUT atomically.  Ctrl-C or SIGTERM keeps every written
  row there and prints the command that finishes the run: the same command plus --resume, which checks
  OUT.partial against the input, the model and the options, keeps its rows and predicts the rest (the
  result is identical to an uninterrupted run).  Without --resume an existing OUT.partial is refused.

exit status:
  0 when at least one input was predicted (any status but 'error'); 1 when none was (every input an
  error, or no data rows); 2 for a usage error, an unreadable model or input file, or a refused --out;
  130 after Ctrl-C, 143 after SIGTERM (interrupted: see above).
"""


def _at_least(minimum):
    """An argparse type: an int >= ``minimum``, else a usage error 'must be >= minimum' (exit status 2)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


@contextlib.contextmanager
def _stop_on_signals():
    """While the block runs, SIGTERM unwinds this process like Ctrl-C (``_Terminated``), and both are
    recorded in _STOP_SIGNALS (checked after every chunk, should the exception be lost); a SIGINT that this
    process was started ignoring (nohup, a background job) stays ignored.  A forked worker that inherits
    the handler just exits (its parent handles the run)."""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        _STOP_SIGNALS.append(signum)
        raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    watched = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler
                                  else [])
    old = {signum: signal.signal(signum, handler) for signum in watched}
    _STOP_SIGNALS.clear()
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)
        _STOP_SIGNALS.clear()


def _partial_path(out):
    """``<out>.partial`` beside the file ``out`` resolves to (as PartialFile names it), or None."""
    try:
        return resolve_target(out) + ".partial"
    except (OSError, ValueError):
        return None


def _resume_command(args):
    """The command line that finishes an interrupted ``predict --csv ... --out`` run (adds --resume)."""
    script = sys.argv[0] if os.path.basename(sys.argv[0]) == "chemdata.py" else "chemdata.py"
    argv = ["python", script, "predict", args.model, "--csv", args.csv, "--column", args.column, "--out", args.out,
            "--resume"]
    for flag, value, default in (("--max-input-tokens", args.max_input_tokens, DEFAULT_MAX_INPUT_TOKENS),
                                 ("--random-smiles", args.random_smiles, 0), ("--workers", args.workers, None),
                                 ("--max-members", args.max_members, None)):
        if value != default:
            argv += [flag, str(value)]
    return shlex.join(argv)


def _predict_csv_command(args, predictor):
    """``predict --csv``: the CSV with seven new columns (stdout or --out); context, progress and counts on
    stderr; an interrupted run says how to finish it."""
    print(f"predict: {predictor.describe()}", file=sys.stderr, flush=True)
    try:
        _, counts, _ = predict_csv(predictor, args.csv, args.column, args.out, workers=args.n_workers,
                                       resume=args.resume, progress=sys.stderr,
                                       stream=None if args.out else sys.stdout)
    except PredictInterrupted as e:
        print(f"predict: interrupted by {e.signal_name} after {e.rows_done} of {e.total} rows", file=sys.stderr)
        if e.partial:
            print(f"predict: the {e.rows_done} finished rows are kept in {e.partial}; to finish the run:\n"
                  f"  {_resume_command(args)}", file=sys.stderr)
        elif e.complete:
            print(f"predict: every row had been written: {e.complete} is complete", file=sys.stderr)
        return 143 if e.signal_name == "SIGTERM" else 130
    except KeyboardInterrupt as e:          # before the first chunk, or between the last one and the rename
        name = "SIGTERM" if isinstance(e, _Terminated) else "SIGINT"
        partial = args.out and _partial_path(args.out)
        if partial and os.path.isfile(partial):
            print(f"predict: interrupted by {name}; the rows finished so far are kept in {partial}; to finish "
                  f"the run:\n  {_resume_command(args)}", file=sys.stderr)
        else:
            print(f"predict: interrupted by {name} before any row was written", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except (OSError, ValueError) as e:
        print(f"predict: {e}", file=sys.stderr)
        return 2
    print(f"predict: rows by status {counts}" + (f"; wrote {args.out}" if args.out else ""), file=sys.stderr)
    return 0 if any(n for status, n in counts.items() if status != "error") else 1


def _predict_command(args):
    """A context line (``# model ...``), a header row and one tab-separated line per input (input,
    prediction_<units>, low, high, spread, status, domain, reason), or the CSV with those seven columns
    added (see _PREDICT_EPILOG)."""
    if bool(args.csv) == bool(args.inputs):
        args.parser.error("give either inputs on the command line or --csv FILE")
    if (args.out or args.resume) and not args.csv:
        args.parser.error("--out and --resume go with --csv FILE")
    if args.resume and not args.out:
        args.parser.error("--resume finishes an interrupted --out: give the same --out")
    try:
        predictor = load_predictor(args.model, max_members=args.max_members, max_input_tokens=args.max_input_tokens,
                                   n_random=args.random_smiles)
    except (OSError, ValueError, TypeError) as e:
        print(f"predict: cannot load {args.model}: {e}", file=sys.stderr)
        return 2
    if args.workers is None:
        from transformer import default_workers
        args.n_workers = default_workers()
    else:
        args.n_workers = args.workers
    with _stop_on_signals():
        if args.csv:
            return _predict_csv_command(args, predictor)
        try:
            results = predictor.predict_detailed(args.inputs, workers=args.n_workers)
        except KeyboardInterrupt as e:
            print("predict: interrupted", file=sys.stderr)
            return 143 if isinstance(e, _Terminated) else 130
    header = ["input", *_output_header(predictor.units)]
    sys.stdout.write(f"# {predictor.describe()}\n" + _csv_text([header] + [[r.input] + _output_fields(r, ".4f")
                                                                          for r in results], delimiter="\t"))
    return 0 if any(r.status != "error" for r in results) else 1


def add_predict_command(subparsers):
    """Add the ``predict`` subcommand to the argparse ``subparsers`` of ``python chemdata.py``
    (``chemdata.main`` parses and dispatches); returns its parser."""
    predict = subparsers.add_parser("predict", help="predict a property with a saved model (models/*.json)",
                                   description="Predict a property with a saved model (models/*.json).",
                                   epilog=_PREDICT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    predict.add_argument("model", help="a saved model file (models/*.json)")
    predict.add_argument("inputs", nargs="*", help="SMILES or formulas, one prediction line each")
    predict.add_argument("--csv", help="input CSV file")
    predict.add_argument("--column", default="smiles", help="CSV column with the inputs (default smiles)")
    predict.add_argument("--out", help="output CSV (default: standard output); checked before any work (see below)")
    predict.add_argument("--resume", action="store_true",
                         help="finish the interrupted run that left OUT.partial (checked first; see below)")
    predict.add_argument("--workers", type=_at_least(1), default=None, metavar="N",
                         help="processes that predict (default: the CPU cores this process may use)")
    predict.add_argument("--max-input-tokens", type=_at_least(1), default=DEFAULT_MAX_INPUT_TOKENS, metavar="N",
                         help=f"refuse longer inputs at once (default {DEFAULT_MAX_INPUT_TOKENS} tokens)")
    predict.add_argument("--random-smiles", type=_at_least(0), default=0, metavar="N",
                         help="average over the canonical SMILES and N random spellings of it (default 0)")
    predict.add_argument("--max-members", type=_at_least(1), default=None, metavar="N",
                         help="use only the first N models of an ensemble file (default: all; fewer: no interval)")
    predict.set_defaults(run=_predict_command, parser=predict)
    return predict
