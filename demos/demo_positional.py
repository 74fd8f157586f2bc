"""Experiment 2 (the tutorial's section 10.2) - positional encodings: the identities behind sine/cosine
positions and RoPE, proof that a Transformer without positions cannot see word (token) order, and a "ladder"
of naive encodings (integer, binary) that shows why the sine table is built the way it is.

Everything is measured with the library's own functions (core.sine_cosine_table, core.rope_rotate,
core.TransformerEncoder, core.TokenPositionEmbedding, core.dot); no number in the results file is typed in.

Results (``results`` in figures/results_positional.json):

``identities`` - the sine table PE (core.sine_cosine_table, d = 64), rows t = 0..255, shifts k = 0..128,
    frequencies w_i = 10000^(-2i/d) written out in closed form here:
      addition_max_err        max |PE_{t+k} - R_k PE_t| over all t, k and entries, where R_k is the
                              block-diagonal rotation by the angles k w_i (depends on k only, not on t):
                              "position t+k is a fixed linear map of position t".
      inner_spread_max        max over k of (max_t - min_t) of <PE_t, PE_{t+k}>: the inner product
                              does not depend on the start position t ...
      inner_max_dev           ... and equals sum_i cos(w_i k): max |<PE_t, PE_{t+k}> - sum_i cos(w_i k)|.
      rope_max_rel_change     RoPE: for n_pairs random (q, k) in R^64 (N(0, 1) entries) at random
                              positions m, n in [0, max_pos), the score s = <R_m q, R_n k> and the
                              score s' after shifting both positions by delta (1, 7, 33):
                              max |s' - s| / (|q| |k|), i.e. relative to the natural scale of the
                              score (its largest possible value).  Also rope_max_abs_change;
                              rope_max_rel_change_pointwise = max |s' - s| / |s| with
                              rope_min_abs_score, the smallest |s| (this ratio is only large when a
                              score happens to be near 0); rope_max_rel_dev_relative_form (and its
                              _pointwise twin): |s - <q, R_{n-m} k>| on the same scales - the score
                              depends on n - m only.  Per-shift records in ``rope_shifts``
                              {delta, max_rel_change, max_abs_change, max_rel_change_pointwise}.
    All of these are rounding-level (~1e-15..1e-13): the identities are exact in real arithmetic.
``inner_product_curve`` - list of records for the figure, one per k = 0..128:
    {k, pe0_dot_pek (<PE_0, PE_k>), closed_form (sum_i cos(w_i k)), spread_over_t, max_dev_over_t,
    addition_max_err}.  <PE_0, PE_k> starts at d/2 = 32 and decays (with ripples) as k grows: nearby
    positions look alike, distant ones do not.

``permutation`` - list of records, one per position scheme (none / sine / learned / rope):
    an untrained core.TransformerEncoder with mean pooling (config["permutation"]) reads n_sequences
    random token sequences and n_shuffles shuffles of each (a shuffle always differs from the
    original); {pos, n_pairs, mean_abs_change, max_abs_change, mean_abs_output, rel_change
    (= mean_abs_change / mean_abs_output)}.  Without positions attention + mean pooling is blind to
    order: the change is rounding noise (~1e-16, only the summation order changed).  With any position
    scheme the output moves.  Note: a freshly initialised learned table has std 0.02 (token embeddings
    have std d^-0.5 = 0.25 here), so its effect is small before training; the number is reported as it is.

``ladder`` - experiment_ladder(): d = 64, positions t = 0..255.
    ``encodings``: list of records {name, dims, norm_min, norm_max, norm_mean, norm_formula (text),
    norm_max_closed_form (number or None),
    adjacent_dist_min, adjacent_dist_max, adjacent_dist_mean, adjacent_dist_cv (std/mean),
    adjacent_dist_distinct (sorted distinct values, when there are few), ...} for
      integer  - t repeated in every one of d dimensions: norm t*sqrt(d) grows without bound
                 (``integer_norm_over_unit_embedding`` = max norm / sqrt(d), the norm of a
                 unit-variance token embedding, ``unit_variance_embedding_norm``);
      binary   - the 8-bit binary code of t (8 dimensions; zero-padding to d changes nothing):
                 bounded, but adjacent distances jump between sqrt(1) and sqrt(8) (carries);
      sine     - core.sine_cosine_table: constant norm sqrt(d/2) and a constant adjacent distance
                 equal to the closed form sqrt(2 sum_i (1 - cos w_i)) (``adjacent_dist_closed_form``,
                 and its square ``adjacent_dist_sq_closed_form``);
      learned  - a freshly initialised learned table (core.TokenPositionEmbedding(..., pos="learned")
                 .pe.W.data, std 0.02): random, with norm ~0.02 sqrt(d) (``init_std`` is measured).
    ``binary_bit_flips``: list of {bit, flip_frequency}: fraction of steps t -> t+1 that flip bit j
    (1, 1/2, 1/4, ...: the low bits change fastest, like the high-frequency sine pairs).
    ``sine_norm_over_learned_norm``: how much smaller the fresh learned table is than the sine table.
    ``norm_curve``: list of {t, integer, binary, sine, learned} norms for the figure.

``checks`` - booleans the smoke tests assert (identities below 1e-12, permutation change for none
    below 1e-12 and above 1e-3 for the others, ...), plus ``learned_change_above_1e-3``.

Usage: python demos/demo_positional.py [--seed 0]; QUICK=1 for the reduced configuration (fewer
sequences in the permutation test, output in figures/quick/).
"""
import math
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import transformer as core

FULL = {
    "identities": {"d": 64, "t_max": 255, "k_max": 128, "base": core.ROPE_BASE},
    "rope": {"d": 64, "n_pairs": 200, "shifts": [1, 7, 33], "max_pos": 128},
    "permutation": {"schemes": list(core.POS_SCHEMES), "vocab_size": 20, "d_model": 16, "n_heads": 2,
                    "n_layers": 2, "d_ff": 32, "max_len": 64, "seq_len": 12, "n_sequences": 20,
                    "n_shuffles": 5},
    "ladder": {"d": 64, "T": 256, "bits": 8, "vocab_size": 20},
    # the shuffle test on real molecules: ESOL scaffold-split test SMILES, atom tokens, an UNTRAINED
    # encoder with the tutorial's ESOL dimensions (d = 48, 4 heads, 2 layers, d_ff = 96, mean pooling)
    "permutation_esol": {"schemes": list(core.POS_SCHEMES), "d_model": 48, "n_heads": 4, "n_layers": 2,
                         "d_ff": 96, "max_len": 128, "n_molecules": None, "n_shuffles": 5,
                         "fractions": [0.8, 0.1, 0.1]},
}

QUICK_OVERRIDES = {
    "rope": dict(FULL["rope"], n_pairs=100),
    "permutation": dict(FULL["permutation"], n_sequences=6, n_shuffles=3),
    "permutation_esol": dict(FULL["permutation_esol"], n_molecules=8, n_shuffles=2),
}


def _frequencies(d, base):
    """w_i = base^(-2i/d), i = 0..d/2-1: the closed form the table is compared against."""
    return [base ** (-2.0 * i / d) for i in range(d // 2)]


def _norm(v):
    return math.sqrt(core.dot(v, v))


def _dist(u, v):
    return _norm([a - b for a, b in zip(u, v)])


def _cv(xs):
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m else None


# ----------------------------------------------------------------------------- identities


def identities(cfg):
    d, t_max, k_max = cfg["d"], cfg["t_max"], cfg["k_max"]
    ws = _frequencies(d, cfg["base"])
    PE = core.sine_cosine_table(t_max + k_max + 1, d)
    curve = []
    add_err = spread_max = dev_max = 0.0
    for k in range(k_max + 1):
        ck = [math.cos(k * w) for w in ws]
        sk = [math.sin(k * w) for w in ws]
        closed = math.fsum(ck)                                  # sum_i cos(w_i k)
        err_k, ips = 0.0, []
        for t in range(t_max + 1):
            p, q = PE[t], PE[t + k]
            sn, cs = p[0::2], p[1::2]                           # sin(t w_i), cos(t w_i)
            # R_k PE_t: rotate every (sin, cos) pair by the angle k w_i
            rs = [s * c + co * si for s, co, c, si in zip(sn, cs, ck, sk)]      # sin((t+k) w_i)
            rc = [co * c - s * si for s, co, c, si in zip(sn, cs, ck, sk)]      # cos((t+k) w_i)
            err_k = max(err_k, max(map(abs, map(float.__sub__, q[0::2], rs))),
                        max(map(abs, map(float.__sub__, q[1::2], rc))))
            ips.append(core.dot(p, q))
        spread = max(ips) - min(ips)
        dev = max(abs(x - closed) for x in ips)
        curve.append({"k": k, "pe0_dot_pek": ips[0], "closed_form": closed, "spread_over_t": spread,
                      "max_dev_over_t": dev, "addition_max_err": err_k})
        add_err, spread_max, dev_max = max(add_err, err_k), max(spread_max, spread), max(dev_max, dev)
    summary = {"d": d, "t_range": [0, t_max], "k_range": [0, k_max], "addition_max_err": add_err,
               "inner_spread_max": spread_max, "inner_max_dev": dev_max}
    return summary, curve


def rope(cfg, rng):
    """RoPE relative property on random (q, k) pairs: the score <R_m q, R_n k> depends on n - m only.

    Relative changes are taken against |q| |k|, the natural scale of the score (its largest possible
    value); dividing by |s| itself blows up for the odd pair whose score happens to be near zero,
    so that pointwise ratio is reported separately (``*_pointwise``) together with the smallest |s|."""
    d, shifts, max_pos = cfg["d"], cfg["shifts"], cfg["max_pos"]
    per_shift = {s: {"max_rel": 0.0, "max_abs": 0.0, "max_pointwise": 0.0} for s in shifts}
    max_rel_dev, max_rel_dev_pw, min_abs = 0.0, 0.0, math.inf
    for _ in range(cfg["n_pairs"]):
        q = [rng.gauss(0.0, 1.0) for _ in range(d)]
        k = [rng.gauss(0.0, 1.0) for _ in range(d)]
        scale = _norm(q) * _norm(k)
        m, n = rng.randrange(max_pos), rng.randrange(max_pos)
        s = core.dot(core.rope_rotate(q, m), core.rope_rotate(k, n))
        min_abs = min(min_abs, abs(s))
        gap = abs(s - core.dot(q, core.rope_rotate(k, n - m)))     # R_m^T R_n = R_{n-m}
        max_rel_dev, max_rel_dev_pw = max(max_rel_dev, gap / scale), max(max_rel_dev_pw, gap / abs(s))
        for delta in shifts:
            s2 = core.dot(core.rope_rotate(q, m + delta), core.rope_rotate(k, n + delta))
            rec = per_shift[delta]
            rec["max_abs"] = max(rec["max_abs"], abs(s2 - s))
            rec["max_rel"] = max(rec["max_rel"], abs(s2 - s) / scale)
            rec["max_pointwise"] = max(rec["max_pointwise"], abs(s2 - s) / abs(s))
    shift_records = [{"delta": s, "max_rel_change": v["max_rel"], "max_abs_change": v["max_abs"],
                      "max_rel_change_pointwise": v["max_pointwise"]} for s, v in per_shift.items()]
    return {"rope_d": d, "rope_n_pairs": cfg["n_pairs"], "rope_shifts_used": shifts,
            "rope_max_rel_change": max(r["max_rel_change"] for r in shift_records),
            "rope_max_abs_change": max(r["max_abs_change"] for r in shift_records),
            "rope_max_rel_change_pointwise": max(r["max_rel_change_pointwise"] for r in shift_records),
            "rope_min_abs_score": min_abs,
            "rope_max_rel_dev_relative_form": max_rel_dev,
            "rope_max_rel_dev_relative_form_pointwise": max_rel_dev_pw}, shift_records


# ----------------------------------------------------------------------------- permutation test


def _shuffles(ids, n, rng):
    """``n`` shuffles of ``ids`` that differ from it ([] if every token is the same)."""
    if len(set(ids)) < 2:
        return []
    out = []
    while len(out) < n:
        p = list(ids)
        rng.shuffle(p)
        if p != ids:
            out.append(p)
    return out


def permutation(cfg, rng, seed):
    """The shuffle test on random token ids (V = 20, length 12, d = 16)."""
    V, T = cfg["vocab_size"], cfg["seq_len"]
    seqs = []
    for _ in range(cfg["n_sequences"]):
        ids = [rng.randrange(V) for _ in range(T)]
        seqs.append((ids, _shuffles(ids, cfg["n_shuffles"], rng)))
    return shuffle_test(cfg, V, seqs, seed)


def esol_test_sequences(cfg, rng):
    """ESOL scaffold-split test SMILES as atom-token ids (vocabulary built on the training SMILES),
    each with ``n_shuffles`` shuffles of its tokens; molecules whose tokens are all alike are skipped."""
    import chemdata
    esol = chemdata.load_esol()
    train_idx, _, test_idx = chemdata.scaffold_split(esol.smiles, tuple(cfg["fractions"]))
    vocab = chemdata.Vocab.build([chemdata.tokenize_smiles(esol.smiles[i]) for i in train_idx])
    test = [esol.smiles[i] for i in test_idx][:cfg["n_molecules"]]
    seqs, skipped = [], 0
    for smi in test:
        ids = vocab.encode(chemdata.tokenize_smiles(smi), add_bos_eos=False)
        sh = _shuffles(ids, cfg["n_shuffles"], rng)
        if sh:
            seqs.append((ids, sh))
        else:
            skipped += 1
    info = {"n_test_molecules": len(test), "n_used": len(seqs), "n_skipped_all_tokens_alike": skipped,
            "vocab_size_with_specials": len(vocab), "unknown_tokens": vocab.unk_count,
            "mean_tokens": statistics.fmean(len(s[0]) for s in seqs), "trained": False,
            "split": f"chemdata.scaffold_split {len(train_idx)}/{len(esol) - len(train_idx) - len(test_idx)}/"
                     f"{len(test_idx)}"}
    return len(vocab), seqs, info


def shuffle_test(cfg, V, seqs, seed):
    """Mean |change| of an untrained mean-pooled encoder's output when the tokens are shuffled."""
    records = []
    for pos in cfg["schemes"]:
        model = core.TransformerEncoder(V, d_model=cfg["d_model"], n_heads=cfg["n_heads"],
                                      n_layers=cfg["n_layers"], d_ff=cfg["d_ff"], n_out=1, pos=pos,
                                      max_len=cfg["max_len"], seed=seed)
        changes, outs, ys = [], [], []
        for ids, shuffles in seqs:
            y = model.forward(ids)[0]
            ys.append(y)
            for p in shuffles:
                changes.append(abs(model.forward(p)[0] - y))
                outs.append(abs(y))
        mean_change, mean_out = statistics.fmean(changes), statistics.fmean(outs)
        spread = statistics.pstdev(ys)                  # how much different inputs differ
        records.append({"pos": pos, "n_pairs": len(changes), "mean_abs_change": mean_change,
                        "max_abs_change": max(changes), "mean_abs_output": mean_out,
                        "rel_change": mean_change / mean_out, "output_std_across_inputs": spread,
                        "change_over_input_spread": mean_change / spread if spread else None,
                        "n_params": core.param_count(model)})
    return records


# ----------------------------------------------------------------------------- the ladder


def _summary(name, rows, norm_formula, norm_max_closed_form, few_distinct=False):
    norms = [_norm(r) for r in rows]
    dists = [_dist(a, b) for a, b in zip(rows, rows[1:])]
    rec = {"name": name, "dims": len(rows[0]), "norm_min": min(norms), "norm_max": max(norms),
           "norm_mean": statistics.fmean(norms), "norm_formula": norm_formula,
           "norm_max_closed_form": norm_max_closed_form,
           "adjacent_dist_min": min(dists), "adjacent_dist_max": max(dists),
           "adjacent_dist_mean": statistics.fmean(dists), "adjacent_dist_cv": _cv(dists)}
    distinct = sorted(set(dists))
    rec["adjacent_dist_n_distinct"] = len(distinct)
    rec["adjacent_dist_distinct"] = distinct if few_distinct or len(distinct) <= 16 else None
    return rec, norms


def experiment_ladder(d=64, T=256, bits=8, vocab_size=20, seed=0):
    """Integer, binary, sine and (freshly initialised) learned position encodings side by side."""
    ts = range(T)
    encodings, curves = [], {}

    integer = [[float(t)] * d for t in ts]                       # t in every dimension
    rec, curves["integer"] = _summary("integer", integer, "t*sqrt(d)", (T - 1) * math.sqrt(d))
    unit = math.sqrt(d)
    rec["norm_over_unit_embedding_max"] = rec["norm_max"] / unit
    encodings.append(rec)

    binary = [[float((t >> j) & 1) for j in range(bits)] for t in ts]   # bit j of t, least significant first
    rec, curves["binary"] = _summary("binary", binary, "sqrt(number of 1 bits of t)", math.sqrt(bits),
                                    few_distinct=True)
    rec["adjacent_dist_possible"] = [math.sqrt(j) for j in range(1, bits + 1)]  # sqrt(#flipped bits)
    encodings.append(rec)
    flips = [{"bit": j, "flip_frequency": sum(a[j] != b[j] for a, b in zip(binary, binary[1:])) / (T - 1)}
             for j in range(bits)]

    sine = core.sine_cosine_table(T, d)
    ws = _frequencies(d, core.ROPE_BASE)
    dist_sq_closed = 2.0 * math.fsum(1.0 - math.cos(w) for w in ws)
    rec, curves["sine"] = _summary("sine", sine, "sqrt(d/2) for every t", math.sqrt(d / 2))
    rec["adjacent_dist_closed_form"] = math.sqrt(dist_sq_closed)
    rec["adjacent_dist_sq_closed_form"] = dist_sq_closed
    rec["adjacent_dist_max_dev_from_closed_form"] = max(
        abs(_dist(a, b) - math.sqrt(dist_sq_closed)) for a, b in zip(sine, sine[1:]))
    encodings.append(rec)

    emb = core.TokenPositionEmbedding(vocab_size, d, pos="learned", max_len=T, rng=random.Random(seed))
    learned = emb.pe.W.data
    rec, curves["learned"] = _summary("learned (fresh init)", learned,
                                      "random; about init_std*sqrt(d) on average (not a bound)", None)
    rec["norm_expected"] = 0.02 * math.sqrt(d)                  # std 0.02 is the library's init
    rec["init_std"] = statistics.pstdev([x for r in learned for x in r])
    encodings.append(rec)

    sine_rec, learned_rec = encodings[2], encodings[3]
    rows = {"integer": integer, "binary": binary, "sine": sine, "learned": learned}
    return {
        "adjacent_curve": [{"t": t, **{k: _dist(v[t], v[t + 1]) for k, v in rows.items()}} for t in range(T - 1)],
        "d": d, "T": T, "bits": bits,
        "unit_variance_embedding_norm": unit,
        "integer_norm_over_unit_embedding": encodings[0]["norm_over_unit_embedding_max"],
        "sine_norm_over_learned_norm": sine_rec["norm_mean"] / learned_rec["norm_mean"],
        "encodings": encodings,
        "binary_bit_flips": flips,
        "norm_curve": [{"t": t, "integer": curves["integer"][t], "binary": curves["binary"][t],
                        "sine": curves["sine"][t], "learned": curves["learned"][t]} for t in ts],
    }


# ----------------------------------------------------------------------------- main


def main():
    args, config, run = common.start("positional", __doc__, FULL, QUICK_OVERRIDES)
    rng = random.Random(args.seed)
    n = 4
    results = {}

    run.stage(1, n, "sine addition theorem, inner-product identity, RoPE relative property")
    ident, curve = identities(config["identities"])
    rope_summary, rope_shifts = rope(config["rope"], rng)
    ident.update(rope_summary)
    results["identities"] = ident
    results["rope_shifts"] = rope_shifts
    results["inner_product_curve"] = curve
    run.log(f"  addition theorem max err {ident['addition_max_err']:.2e}; inner product spread "
            f"{ident['inner_spread_max']:.2e}, max dev from sum cos(w k) {ident['inner_max_dev']:.2e}; "
            f"RoPE max rel change {ident['rope_max_rel_change']:.2e}")

    run.stage(2, n, "permutation test: untrained encoder, shuffled tokens")
    results["permutation"] = permutation(config["permutation"], rng, args.seed)
    for r in results["permutation"]:
        run.log(f"  pos={r['pos']:8s} mean |change| {r['mean_abs_change']:.3e} "
                f"(relative {r['rel_change']:.3e}, mean |y| {r['mean_abs_output']:.3f})")

    run.log("  the same on ESOL test SMILES (atom tokens, untrained d = 48 encoder)")
    V, seqs, info = esol_test_sequences(config["permutation_esol"], rng)
    results["permutation_esol"] = shuffle_test(config["permutation_esol"], V, seqs, args.seed)
    results["permutation_esol_data"] = info
    for r in results["permutation_esol"]:
        run.log(f"  ESOL pos={r['pos']:8s} mean |change| {r['mean_abs_change']:.3e} "
                f"(relative {r['rel_change']:.3e}, mean |y| {r['mean_abs_output']:.3f})")

    run.stage(3, n, "the ladder: integer, binary, sine, learned encodings")
    c = config["ladder"]
    results["ladder"] = experiment_ladder(c["d"], c["T"], c["bits"], c["vocab_size"], args.seed)
    for r in results["ladder"]["encodings"]:
        run.log(f"  {r['name']:20s} norm {r['norm_min']:.3f}..{r['norm_max']:.3f} (mean {r['norm_mean']:.3f}); "
                f"adjacent distance {r['adjacent_dist_min']:.4f}..{r['adjacent_dist_max']:.4f}, "
                f"CV {r['adjacent_dist_cv']:.2e}")

    run.stage(4, n, "summary checks")
    results["checks"] = summary_checks(results)
    run.log(f"  checks: {results['checks']}")
    run.finish(results)


def summary_checks(results):
    """The booleans of the smoke tests, from the measured sections of ``results``."""
    ident = results["identities"]
    perm = {r["pos"]: r for r in results["permutation"]}
    return {
        "addition_theorem_below_1e-12": ident["addition_max_err"] < 1e-12,
        "inner_product_spread_below_1e-12": ident["inner_spread_max"] < 1e-12,
        "inner_product_closed_form_below_1e-12": ident["inner_max_dev"] < 1e-12,
        "rope_shift_invariance_below_1e-12": ident["rope_max_rel_change"] < 1e-12,
        "esol_permutation_none_below_1e-12": all(r["max_abs_change"] < 1e-12 for r in results["permutation_esol"]
                                                 if r["pos"] == "none"),
        "esol_permutation_others_above_1e-3": all(r["rel_change"] > 1e-3 for r in results["permutation_esol"]
                                                  if r["pos"] != "none"),
        "permutation_none_below_1e-12": perm["none"]["mean_abs_change"] < 1e-12
                                        and perm["none"]["max_abs_change"] < 1e-12,
        "permutation_others_above_1e-3": all(r["mean_abs_change"] > 1e-3 for p, r in perm.items() if p != "none"),
        "learned_change_above_1e-3": perm["learned"]["mean_abs_change"] > 1e-3,
    }


if __name__ == "__main__":
    main()
