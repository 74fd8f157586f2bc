"""How good are generated molecules: the n-gram baseline, distribution metrics and the tutorial's scores.

Experiment 4 (the SMILES language model on ESOL) reports bits/token and, for samples, RDKit validity,
uniqueness and novelty; experiment 5 calls the model "an n-gram statistics machine" without training one.
This module holds the measures the demos add around those numbers:

    1. the n-gram baseline   NgramLM (interpolated or modified Kneser-Ney on the Transformer's token ids; it
                             samples through ``transformer.generate`` like the Transformer), fit_ngram (variant,
                             n and discount chosen on validation), ngram_choice_interior (is the choice inside
                             the grid), ngram_bits_per_token (experiments 4 and 5)
    2. distributions         guacamol_kl_score, kl_score_at_size, fcd_score (GuacaMol's KL and FCD scores,
                             guacamol and fcd imported lazily, install line GUACAMOL_HINT), moses_metrics,
                             length_histogram, distribution_metrics (all of them for one set of samples)
    3. the tutorial's scores tutorial_novelty (validity, uniqueness, novelty as the tutorial computes
                             them), tutorial_scores_by_block (the same on blocks of the tutorial's size)
    4. sample shape          molecule_shape, shape_summary (heavy atoms, SSSR rings, rings larger than
                             training's), ks_statistic (two-sample KS D), validity_by_length

Standard library only at module level; RDKit, numpy, guacamol and fcd are imported by the functions that
need them.  Callers import this module by name (``import generation_metrics; generation_metrics.NgramLM``).
"""

import math
import random
from collections import Counter

from chemdata import import_rdkit, quiet_rdkit, canonical_smiles, tokenize_smiles

__all__ = ["NgramLM", "ngram_bits_per_token", "fit_ngram", "GUACAMOL_HINT", "distribution_packages_available",
           "guacamol_kl_score", "kl_score_at_size", "fcd_score", "moses_metrics", "length_histogram",
           "distribution_metrics", "distribution_package_versions", "tutorial_novelty",
           "tutorial_scores_by_block", "NGRAM_VARIANTS", "count_of_counts", "DISCOUNT_GRID", "SCALE_GRID", "MAX_SCALE",
           "NGRAM_ORDERS", "ngram_choice_interior", "molecule_shape", "shape_summary", "ks_statistic",
           "VALIDITY_LENGTH_BINS", "validity_by_length"]


# =====================================================================================
# 1. The n-gram baseline
# =====================================================================================

NGRAM_VARIANTS = ("interpolated", "modified")


class NgramLM:
    """Token n-gram language model with Kneser-Ney smoothing, on the same ids as the Transformer
    (``fit(sequences)``: lists of ids, <bos> first, <eos> last).

    variant "interpolated" (one discount D for every count and order, the default):
        P(w | h) = max(c(h w) - D, 0) / c(h) + D N1+(h .) / c(h) P(w | h'),   h' = h without its first id;
    variant "modified" (Chen & Goodman 1998, eqs. 17-19 there; three discounts per order):
        P(w | h) = (c(h w) - D(c(h w))) / c(h) + gamma(h) P(w | h'),
        D(0) = 0, D(1) = D1, D(2) = D2, D(c >= 3) = D3+,
        gamma(h) = (D1 N1(h .) + D2 N2(h .) + D3+ N3+(h .)) / c(h),
    the discounts of each order estimated from that order's count-of-counts n1..n4 (``_estimated_discounts``:
    Y = n1 / (n1 + 2 n2), D1 = 1 - 2 Y n2 / n1, D2 = 2 - 3 Y n3 / n2, D3+ = 3 - 4 Y n4 / n3).  For
    "modified", ``discount`` is None (the estimates as they are) or a scale s in (0, 1] (each D = s x its
    estimate); ``discount`` left out means 0.75 for "interpolated" and None for "modified".

    In both, the highest order uses counts, the lower ones continuation counts (distinct left neighbours),
    the unigram is interpolated with uniform over all ``vocab_size`` ids (so every id has p > 0 and each
    distribution sums to 1).  A history with no count falls back to the lower order.  Sequences are
    left-padded with n - 2 extra <bos> so every prediction has a full history.

    ``next_logits(ids)`` = log P(. | last n - 1 ids): the next-token row that ``transformer.generate``
    samples from, the same path (temperature, top-k, constraint, backtrack) as the Transformer's.
    ``bits(sequence)`` = - log2 P of every target after the first id (one probability each, not a row).
    ``with_smoothing(variant, discount)``: a model on the same counts with other smoothing (no refit)."""

    def __init__(self, vocab_size, n=3, discount=None, bos_id=1, variant="interpolated"):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"NgramLM: n must be an int >= 1, got {n!r}")
        if variant not in NGRAM_VARIANTS:
            raise ValueError(f"NgramLM: variant must be one of {NGRAM_VARIANTS}, got {variant!r}")
        if variant == "interpolated":
            discount = 0.75 if discount is None else discount
            if not 0 < discount < 1:
                raise ValueError(f"NgramLM: discount must be in (0, 1), got {discount!r}")
        elif discount is not None and not 0 < discount <= MAX_SCALE:
            raise ValueError(f"NgramLM: the modified variant's discount scale must be None or in (0, {MAX_SCALE}], "
                             f"got {discount!r}")
        self.vocab_size, self.n, self.discount, self.bos_id = vocab_size, n, discount, bos_id
        self.variant = variant
        self.counts = [dict() for _ in range(n)]         # order k + 1: {history of k ids: Counter(next)}
        self.discounts = None                            # per order: (D1, D2, D3+), set by fit
        self._cache, self._pcache, self._hcache = {}, {}, {}

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
        self._set_discounts()
        return self

    def _set_discounts(self):
        """The (D1, D2, D3+) of each order (index k: histories of k ids) for this variant; clears the memos."""
        if self.variant == "interpolated":
            self.discounts = [(self.discount,) * 3 for _ in range(self.n)]
        else:
            scale = 1.0 if self.discount is None else self.discount
            self.discounts = [tuple(min(max(scale * d, _D_MARGIN), c - _D_MARGIN)      # kept inside (0, c)
                                    for c, d in zip((1, 2, 3), _estimated_discounts(count_of_counts(order))))
                              for order in self.counts]
        self._cache, self._pcache, self._hcache = {}, {}, {}

    def with_smoothing(self, variant="interpolated", discount=None):
        """A model of this one's n on the same (shared, read-only) counts with another variant or discount:
        fit_ngram's grid fits the counts once per n."""
        other = NgramLM(self.vocab_size, self.n, discount, self.bos_id, variant)
        other.counts = self.counts
        other._set_discounts()
        return other

    def _history(self, h):
        """(c(h), gamma(h)) of a history with counts, memoized; gamma(h) = sum over w of D(c(h w)) / c(h)
        (= D N1+(h .) / c(h) when the three discounts are one D)."""
        if h not in self._hcache:
            c = self.counts[len(h)][h]
            d1, d2, d3 = self.discounts[len(h)]
            total = sum(c.values())
            if d1 == d2 == d3:
                back = d1 * len(c) / total                  # the interpolated form, as before: same floats
            else:
                back = math.fsum(d1 if k == 1 else d2 if k == 2 else d3 for k in c.values()) / total
            self._hcache[h] = (total, back)
        return self._hcache[h]

    def _d(self, order, k):
        """D(k) at an order: the discount taken off a count k >= 1."""
        d1, d2, d3 = self.discounts[order]
        return d1 if k == 1 else d2 if k == 2 else d3

    def _dist(self, h):
        """P(. | h) over all ids (h: a tuple of up to n - 1 ids), memoized."""
        if h in self._cache:
            return self._cache[h]
        V = self.vocab_size
        lower = self._dist(h[1:]) if h else [1.0 / V] * V
        c = self.counts[len(h)].get(h)
        if not c:
            p = lower
        else:
            total, back = self._history(h)
            p = [back * q for q in lower]                   # gamma(h) P(. | h')
            for w, k in c.items():
                p[w] += (k - self._d(len(h), k)) / total    # (c(h w) - D(c(h w))) / c(h)
        self._cache[h] = p
        return p

    def _prob(self, h, w):
        """P(w | h) alone (the same formula and floats as ``_dist(h)[w]``, one term per order), memoized."""
        key = (h, w)
        if key in self._pcache:
            return self._pcache[key]
        lower = self._prob(h[1:], w) if h else 1.0 / self.vocab_size
        c = self.counts[len(h)].get(h)
        if not c:
            p = lower
        else:
            total, back = self._history(h)
            p = back * lower
            k = c.get(w, 0)
            if k:
                p += (k - self._d(len(h), k)) / total
        self._pcache[key] = p
        return p

    def _context(self, ids):
        ids = self._padded(ids)
        return tuple(ids[len(ids) - self.n + 1:]) if self.n > 1 else ()

    def probs(self, ids):
        """P(next id | ids) as a list over the vocabulary."""
        if self.discounts is None:
            raise ValueError("NgramLM: call fit(sequences) before asking for probabilities")
        return self._dist(self._context(ids))

    def next_logits(self, ids):
        return [math.log(p) for p in self.probs(ids)]

    def bits(self, seq):
        """- log2 P of each target seq[1:] (a list)."""
        if self.discounts is None:
            raise ValueError("NgramLM: call fit(sequences) before asking for probabilities")
        return [-math.log2(self._prob(self._context(seq[:t]), seq[t])) for t in range(1, len(seq))]


def count_of_counts(order_counts, top=4):
    """[n1, ..., n_top]: n_r = how many (history, id) pairs of one order have count exactly r."""
    hist = Counter(k for c in order_counts.values() for k in c.values() if k <= top)
    return [hist[r] for r in range(1, top + 1)]


_D_MARGIN = 0.01       # each estimated D_c is clipped into [0.01, c - 0.01]: strictly inside (0, c)


def _estimated_discounts(nc):
    """(D1, D2, D3+) from the count-of-counts nc = [n1, n2, n3, n4] (Chen & Goodman 1998, eq. 26):
    Y = n1 / (n1 + 2 n2), D1 = 1 - 2 Y n2 / n1, D2 = 2 - 3 Y n3 / n2, D3+ = 3 - 4 Y n4 / n3.
    A count-of-count in a denominator that is 0 leaves its D undefined: Y falls back to 0.5 (no singletons),
    D_c to D_{c-1} (one discount from there up, as interpolated KN).  Each D_c is clipped into
    [0.01, c - 0.01], so c - D_c > 0 (every seen id keeps mass) and D_c > 0 (every history backs off)."""
    n1, n2, n3, n4 = nc
    y = n1 / (n1 + 2 * n2) if n1 else 0.5
    d1 = 1 - 2 * y * n2 / n1 if n1 else y
    d2 = 2 - 3 * y * n3 / n2 if n2 else d1
    d3 = 3 - 4 * y * n4 / n3 if n3 else d2
    return tuple(min(max(d, _D_MARGIN), c - _D_MARGIN) for c, d in ((1, d1), (2, d2), (3, d3)))


def ngram_bits_per_token(model, sequences):
    """Token-weighted bits/token of ``sequences`` (every target after <bos>, <eos> included)."""
    bits = [b for s in sequences for b in model.bits(s)]
    return math.fsum(bits) / len(bits)


DISCOUNT_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.97, 0.99)   # 0.05, ..., 0.95, 0.97, 0.99
SCALE_GRID = (1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5)   # "modified": scales above 1 of the estimated discounts too
MAX_SCALE = 2.0                                            # (each scaled D_c is still clipped into (0, c))
NGRAM_ORDERS = range(2, 21)                                # n in 2..20


def _variant_values(variant, discounts):
    """The discount values tried for a variant: D for "interpolated"; for "modified" the same values as
    scales of the estimated discounts plus SCALE_GRID (1.0: Chen & Goodman's estimates unscaled; above 1: more
    discount, each D_c still clipped into (0, c))."""
    if variant == "interpolated":
        return tuple(discounts)
    return tuple(sorted(set(d for d in discounts if 0 < d <= 1) | set(SCALE_GRID)))


def fit_ngram(train, valid, vocab_size, bos_id, orders=NGRAM_ORDERS, discounts=DISCOUNT_GRID,
              variants=NGRAM_VARIANTS):
    """Choose the variant, n and discount on the validation sequences (lowest bits/token; the first of
    ties in grid order); returns (the chosen NgramLM fitted on train, [{variant, n, discount,
    valid_bits_per_token}] of every triple tried).  "interpolated" tries each D in ``discounts``;
    "modified" tries each as a scale of its estimated discounts, and 1.0 (``_variant_values``).  The
    counts are fitted once per n and shared by every smoothing of that n (``NgramLM.with_smoothing``)."""
    for v in variants:
        if v not in NGRAM_VARIANTS:
            raise ValueError(f"fit_ngram: variant must be one of {NGRAM_VARIANTS}, got {v!r}")
    grid, best, best_bits = [], None, math.inf
    for n in orders:
        base = NgramLM(vocab_size, n, None, bos_id).fit(train)
        for variant in variants:
            for d in _variant_values(variant, discounts):
                m = base.with_smoothing(variant, d)
                bits = ngram_bits_per_token(m, valid)
                grid.append({"variant": variant, "n": n, "discount": d, "valid_bits_per_token": bits})
                if bits < best_bits:
                    best, best_bits = m, bits
    if best is None:
        raise ValueError(f"fit_ngram: an empty grid (orders {list(orders)!r}, variants {variants!r})")
    return best, grid


def ngram_choice_interior(grid, chosen):
    """Whether the chosen n and discount lie inside the grid tried (not at the smallest or largest value
    tried for the chosen variant): an optimum on an edge may lie outside the grid.  ``chosen``: a grid row
    or an NgramLM.  Returns {"n_interior": bool, "discount_interior": bool} (False when one value was tried)."""
    get = chosen.get if isinstance(chosen, dict) else lambda key: getattr(chosen, key)
    variant, n, d = get("variant"), get("n"), get("discount")
    rows = [g for g in grid if g["variant"] == variant]
    if not any(g["n"] == n and g["discount"] == d for g in rows):
        raise ValueError(f"ngram_choice_interior: the choice {(variant, n, d)!r} is not in the grid")
    ns, ds = [g["n"] for g in rows], [g["discount"] for g in rows]
    return {"n_interior": min(ns) < n < max(ns), "discount_interior": min(ds) < d < max(ds)}


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
    scoring; ChemNet weights shipped in the wheel) of the valid samples against ``reference``, and GuacaMol's
    score exp(-0.2 FCD): {fcd, score, n}."""
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


# =====================================================================================
# 4. Sample shape: size, rings, KS distance, validity by length
# =====================================================================================

def molecule_shape(smiles):
    """{"heavy_atoms", "rings", "largest_ring"} of one SMILES (RDKit: heavy atoms, the smallest set of
    smallest rings ``Chem.GetSSSR`` and its largest ring size, 0 without a ring), or None when RDKit cannot
    parse it (or it is empty / None)."""
    if not smiles:
        return None
    Chem = import_rdkit()
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    sizes = [len(ring) for ring in Chem.GetSSSR(mol)]
    return {"heavy_atoms": mol.GetNumHeavyAtoms(), "rings": len(sizes), "largest_ring": max(sizes, default=0)}


def shape_summary(smiles_list, train_max_ring=8):
    """The shape of a set of SMILES: n, n_valid (parsed by RDKit), mean_heavy_atoms, heavy_atoms_hist and
    ring_count_hist ({value: molecules}, keys ascending), and share_ring_larger_than: the share of VALID
    molecules whose largest SSSR ring has more than ``train_max_ring`` atoms (rings the training set
    never has).  Means and shares are None when no SMILES is valid."""
    shapes = [s for s in (molecule_shape(x) for x in smiles_list) if s is not None]
    k = len(shapes)

    def hist(key):
        c = Counter(s[key] for s in shapes)
        return {v: c[v] for v in sorted(c)}
    return {"n": len(smiles_list), "n_valid": k, "train_max_ring": train_max_ring,
            "mean_heavy_atoms": math.fsum(s["heavy_atoms"] for s in shapes) / k if k else None,
            "heavy_atoms_hist": hist("heavy_atoms"), "ring_count_hist": hist("rings"),
            "share_ring_larger_than": sum(s["largest_ring"] > train_max_ring for s in shapes) / k if k else None}


def ks_statistic(a, b):
    """The two-sample Kolmogorov-Smirnov statistic D = sup_x |F_a(x) - F_b(x)| of two samples of numbers
    (F: the empirical distribution functions, right-continuous).  The sup is reached at a sample value; the
    walk over the merged sorted values takes every copy of a tied value from both samples before comparing,
    so ties between or within the samples count as in scipy.stats.ks_2samp."""
    if not a or not b:
        raise ValueError(f"ks_statistic: both samples must be non-empty, got sizes {len(a)} and {len(b)}")
    xa, xb = sorted(a), sorted(b)
    na, nb, i, j, d = len(xa), len(xb), 0, 0, 0.0
    while i < na and j < nb:
        x = min(xa[i], xb[j])
        while i < na and xa[i] == x:
            i += 1
        while j < nb and xb[j] == x:
            j += 1
        d = max(d, abs(i / na - j / nb))                    # F_a(x) - F_b(x) just at x (both steps taken)
    return d                                                # past either end the gap only shrinks to 0


VALIDITY_LENGTH_BINS = ((0, 10), (10, 20), (20, 30), (30, 60), (60, None))


def validity_by_length(token_lengths, valid_flags, bins=VALIDITY_LENGTH_BINS):
    """Validity per length bin: rows {"bin", "n", "valid", "validity"}, one per bin [lo, hi) (hi None: no
    upper end), labelled "lo-(hi-1)" or "lo+"; validity = valid / n, None for an empty bin.  A length in no
    bin, or lists of different lengths, raise ValueError."""
    if len(token_lengths) != len(valid_flags):
        raise ValueError(f"validity_by_length: {len(token_lengths)} lengths but {len(valid_flags)} validity flags")
    rows = [{"bin": f"{lo}+" if hi is None else f"{lo}-{hi - 1}", "n": 0, "valid": 0, "validity": None}
            for lo, hi in bins]
    for length, ok in zip(token_lengths, valid_flags):
        at = [r for r, (lo, hi) in zip(rows, bins) if lo <= length and (hi is None or length < hi)]
        if not at:
            raise ValueError(f"validity_by_length: the length {length!r} is in no bin of {bins!r}")
        at[0]["n"] += 1
        at[0]["valid"] += bool(ok)
    for r in rows:
        r["validity"] = r["valid"] / r["n"] if r["n"] else None
    return rows
