"""How good are generated molecules: the n-gram baseline, distribution metrics and the tutorial's scores.

Experiment 4 (the SMILES language model on ESOL) reports bits/token and, for samples, RDKit validity,
uniqueness and novelty; experiment 5 calls the model "an n-gram statistics machine" without training one.
This module holds the measures the demos add around those numbers:

    1. the n-gram baseline   NgramLM (interpolated Kneser-Ney on the Transformer's token ids; it samples
                             through ``transformer.generate`` like the Transformer), fit_ngram,
                             ngram_bits_per_token (experiments 4 and 5)
    2. distributions         guacamol_kl_score, kl_score_at_size, fcd_score (GuacaMol's KL and FCD scores,
                             guacamol and fcd imported lazily, install line GUACAMOL_HINT), moses_metrics,
                             length_histogram, distribution_metrics (all of them for one set of samples)
    3. the tutorial's scores tutorial_novelty (validity, uniqueness, novelty as the tutorial computes
                             them), tutorial_scores_by_block (the same on blocks of the tutorial's size)

Standard library only at module level; RDKit, numpy, guacamol and fcd are imported by the functions that
need them.  ``chemdata`` re-exports every name in ``__all__`` (``chemdata.NgramLM`` works too).
"""

import math
import random
from collections import Counter

from chemdata import import_rdkit, quiet_rdkit, canonical_smiles, tokenize_smiles

__all__ = ["NgramLM", "ngram_bits_per_token", "fit_ngram", "GUACAMOL_HINT", "distribution_packages_available",
           "guacamol_kl_score", "kl_score_at_size", "fcd_score", "moses_metrics", "length_histogram",
           "distribution_metrics", "distribution_package_versions", "tutorial_novelty",
           "tutorial_scores_by_block"]


# =====================================================================================
# 1. The n-gram baseline
# =====================================================================================

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


# =====================================================================================
# 2. Distribution metrics: GuacaMol KL and FCD, MOSES, token lengths
# =====================================================================================

GUACAMOL_HINT = "pip install --no-deps guacamol==0.5.5 && pip install fcd==1.2.2 tqdm joblib"


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
        # guacamol bins each discrete descriptor on the reference's range and takes the samples' histogram
        # density on those bins: when no sample falls inside them that is 0 / 0 (numpy's "invalid value
        # encountered in divide"), a NaN divergence that is reported below, so the division is not warned of.
        with quiet_rdkit(), numpy.errstate(invalid="ignore", divide="ignore"):
            res = KLDivBenchmark(number_samples=n, training_set=list(reference)).assess_model(_ListGenerator(unique))
    except (ValueError, numpy.linalg.LinAlgError) as e:     # a set too small or too uniform for its KDEs
        return {"score": None, "number_samples": n, "error": f"{type(e).__name__}: {e}"}
    if not math.isfinite(res.score):
        bad = sorted(k for k, v in res.metadata.get("kl_divs", {}).items() if not math.isfinite(v))
        return {"score": None, "number_samples": n,
                "error": "guacamol returned a non-finite score" + (
                    f" (no finite KL divergence for {', '.join(bad)})"
                    if bad else "")}
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
    with quiet_rdkit():
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
    Chem = import_rdkit()
    with quiet_rdkit():
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


# =====================================================================================
# 3. The tutorial's validity, uniqueness and novelty
# =====================================================================================

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
