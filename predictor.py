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

Files of any size and the ``chem-transformer-predict`` command run this predictor: ``predict_files``.

Standard library only at module level; RDKit and ``transformer`` are imported by the functions that need
them.  Callers import this module by name (``import predictor; predictor.load_predictor(path)``).
"""

import json
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from fractions import Fraction

from chemdata import Vocab, import_rdkit, quiet_rdkit, canonical_smiles, rdkit_available, tokenize_smiles
from formulas import formula_explicit, parse_formula, tokenize_formula
from property_features import randomized_smiles

__all__ = ["PredictorFormatError", "PREDICTOR_TOKENIZERS", "PREDICT_STATUSES", "DEFAULT_MAX_INPUT_TOKENS",
           "DOMAIN_COVERAGE", "LEGACY_SMILES_PREPARATION", "NO_REFERENCE", "prepare_smiles",
           "smiles_preparation_record", "composition_similarity", "domain_reference", "domain_threshold",
           "Prediction", "Predictor", "load_predictor", "conformal_quantile", "interval_scale",
           "interval_half_width", "NO_SKILL_NOTE", "SKILL_NOTE", "Z_RANGE", "NO_CLAIM_NOTE"]


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
    return problems or _derived_problems(meta)


Z_RANGE = 1e3
"""A model's output, in training standard deviations, that a model file must be able to turn into a finite value
(with its interval): +-1,000 (a trained model's outputs stay within a few); ``_derived_problems`` checks it."""


def _derived_problems(meta):
    """What a file's meta, each field finite and in range, still makes infinite (checked at load): the unscaled
    value range target_mean +- Z_RANGE * target_std (and the sum over an ensemble's members, whose mean is
    the value), the interval's half-width q * (u + offset) at u = 0 and u = 1, and the bounds value +- that
    half-width over the value range.  (target_mean = 1e308 made every value inf; interval q = offset = 1e308
    gave -inf .. inf with status ok.)"""
    mean, std, k = meta["target_mean"], meta["target_std"], _ensemble_size(meta)
    ends = (mean - Z_RANGE * std, mean + Z_RANGE * std)
    if not all(math.isfinite(x) and math.isfinite(k * x) for x in ends):
        return [f"meta.target_mean {mean!r} and meta.target_std {std!r} give no finite value for a model output "
                f"of +-{Z_RANGE:g} training standard deviations" + (f" (summed over {k} members)" if k > 1 else "")]
    interval = meta.get("interval")
    if interval is None:
        return []
    halves = [interval["q"] * (u + interval["offset"]) for u in (0.0, 1.0)]
    if not all(math.isfinite(h) for h in halves):
        return [f"meta.interval.q {interval['q']!r} and offset {interval['offset']!r} give a half-width "
                f"q * (u + offset) that is not finite ({halves[0]!r} at u = 0, {halves[1]!r} at u = 1)"]
    if not all(math.isfinite(x + sign * h) for x in ends for h in halves for sign in (-1, 1)):
        return [f"meta.interval.q {interval['q']!r} and offset {interval['offset']!r} give bounds that are not "
                f"finite around the value range {ends[0]:.6g} .. {ends[1]:.6g}"]
    return []


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
    offset >= 0 (offset > 0 for 'constant'), n_calibration an int >= 1, n_members (the number of members whose
    mean it was calibrated for; files before it: see ``_interval_members``) absent, null or an int >= 1, and
    the rule a string."""
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
          "n_members": interval.get("n_members") is None or _is_int(interval["n_members"], 1),
          "rule": isinstance(interval.get("rule"), str)}
    want = {"level": "a number in (0, 1)", "scale": f"one of {list(_INTERVAL_SCALES)}", "q": "a number >= 0",
            "offset": "a number >= 0 (> 0 for scale 'constant')", "n_calibration": "an int >= 1",
            "n_members": "null or an int >= 1", "rule": "a string"}
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


def _cut(reason, limit=500):
    """A reason of at most about ``limit`` characters: a message that quotes a huge input whole is cut, with
    its length."""
    return reason if len(reason) <= limit else f"{reason[:limit]}... ({len(reason):,} characters)"


NO_SKILL_NOTE = "no better than predicting the training mean on test"
"""The note every predicted row's reason carries when the model file's ``meta['skill']['beats_mean']`` is false."""

SKILL_NOTE = "beats predicting the training mean on test (paired)"
"""The note a row predicted in the domain (status 'ok') carries when ``meta['skill']['beats_mean']`` is true: a file
with a skill verdict says, on each such row, whether its model beats the mean."""

NO_CLAIM_NOTE = "no skill claim"
"""The note that replaces the skill verdict on a row without an in-domain prediction: the test split measured the
model's skill on molecules like its training set, which says nothing of this input.  The reason follows it."""

_NO_CLAIM_WHY = {"out_of_domain": "outside the applicability domain", "invalid": "input is not a valid molecule",
                 "unchecked": "the applicability domain could not be checked"}


def _ensemble_size(meta):
    """How many models a model file holds: the ensemble's members, or 1."""
    return len(meta["ensemble"]["members"]) if meta.get("ensemble") else 1


def _interval_members(meta):
    """How many members' mean the file's interval was calibrated for: ``meta['interval']['n_members']``; for a
    file written before that field, the seeds of its ``selection`` (the ensemble is every seed), else its
    ensemble size.  A file that has lost its ensemble block still says 3, and gets no interval."""
    recorded = (meta.get("interval") or {}).get("n_members")
    if recorded is not None:
        return recorded
    seeds = (meta.get("selection") or {}).get("seeds") if isinstance(meta.get("selection"), dict) else None
    return len(seeds) if isinstance(seeds, list) and seeds else _ensemble_size(meta)


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
    member it was calibrated for is used (``_interval_members``: the mean of that many models)."""

    def __init__(self, model, meta, path="", max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, n_random=0):
        problems = _meta_problems(meta) if isinstance(meta, dict) else [f"meta must be an object, got {meta!r:.80}"]
        if problems:
            raise PredictorFormatError(f"{path}: " + "; ".join(problems))
        self.members = list(model) if isinstance(model, (list, tuple)) else [model]
        self.n_file_members = _ensemble_size(meta)
        if not 1 <= len(self.members) <= self.n_file_members:
            raise ValueError(f"{len(self.members)} models given, the model file holds {self.n_file_members}")
        self.model, self.meta, self.path = self.members[0], meta, path
        self.interval_members = _interval_members(meta)
        self.interval = meta.get("interval") if len(self.members) == self.interval_members else None
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
        if not all(math.isfinite(v) for v in values + [sum(values)]):
            raise ValueError(f"the model's output is no finite value in {self.units} (an output of "
                             f"{z:.3g} training standard deviations)")
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
        if half is None or not (math.isfinite(value - half) and math.isfinite(value + half)):
            return None, None
        return value - half, value + half

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
            notes.append(self.skill_note if status == "ok" else f"{NO_CLAIM_NOTE} ({_NO_CLAIM_WHY[status]})")
        low, high = self.interval_of(value, spread, sim)
        return Prediction(str(text), value, status, "; ".join(notes), n_unk, domain, prepared, sim, spread, low, high)

    def _outcome(self, text):
        """The ``Prediction`` of one input string; one that cannot be predicted gets status 'error'."""
        try:
            return self._one(text)
        except ValueError as e:
            return Prediction(text, None, "error", _cut(str(e)))
        except Exception as e:                # never let one input stop the others
            return Prediction(text, None, "error", _cut(f"{type(e).__name__}: {e}"))

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
            held = f"; the file holds {self.n_file_members}" if self.n_file_members != self.interval_members else ""
            return (f"no interval (calibrated for an ensemble of {self.interval_members} models, {len(self.members)} "
                    f"used{held})")
        scaled = {"constant": "of constant width", "spread": "scaled by the ensemble spread",
                  "similarity": "scaled by 1 - similarity to the nearest training input"}[self.interval["scale"]]
        coverage = ((self.meta.get("errors") or {}).get("test") or {}).get("coverage")
        covered = f" (test coverage {coverage:.0%})" if coverage is not None else ""
        return f"{self.interval['level'] * 100:g} % split-conformal interval, {scaled}{covered}"

    def _describe_skill(self):
        """The file's skill verdict with its test size and paired interval (Δ test RMSE against the training
        mean, when the file records them: a verdict over a few dozen inputs reads differently from one over
        thousands), and where the rows state it (in-domain rows only)."""
        sk = self.meta.get("skill") or {}
        size = f", {sk['n_items']} test inputs" if sk.get("n_items") else ""
        if all(isinstance(sk.get(k), (int, float)) for k in ("diff_rmse", "ci_low", "ci_high")):
            size += f", Δ RMSE {sk['diff_rmse']:+.3f} [{sk['ci_low']:+.3f}, {sk['ci_high']:+.3f}]"
        return f"{self.skill_note}{size}; stated on in-domain rows only"

    def describe(self):
        """One line of context: ``describe_lines`` joined by '; '."""
        return "; ".join(self.describe_lines())

    def describe_lines(self):
        """The context, one fact per item: model file, target and units, the measured errors (or validation
        RMSE), the ensemble, the interval, the skill, input preparation, domain and input limit."""
        parts = [f"model {self.path}: {self.task} in {self.units}", self._describe_errors(),
                 self._describe_members(), self._describe_interval()]
        if self.skill_note:
            parts.append(self._describe_skill())
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
        return parts

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
