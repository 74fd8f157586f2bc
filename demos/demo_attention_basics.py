"""Experiment 1 (the tutorial's section 10.1) - attention check-up: why scores are divided by sqrt(d_k), what
temperature does, why softmax rather than "divide by the sum", what attention costs, and whether every
backward is right.

Everything is measured with the library's own functions (core.matmul_nt, core.softmax_rows,
core.MultiHeadAttention, core.gradient_check, ...); no number in the results file is typed in.

What is measured (sections of ``results`` in figures/results_attention.json):

``scaling`` - list of records, one per key width d_k in config["scaling"]["d_k"]:
    For n = 16 keys and ``n_draws`` independent draws, a query q and 16 keys k_j are drawn with
    N(0, 1) entries and the scores s_j = <q, k_j> are computed with core.matmul_nt (unscaled) and
    divided by sqrt(d_k) (scaled).
      d_k, n_keys, n_draws
      unscaled_var, scaled_var     variance of all n_draws * 16 scores pooled (sample variance, ddof 1).
                                   Theory: d_k and 1.  (The dot product of two unit-variance vectors
                                   is a sum of d_k unit-variance terms.)
      unscaled_within_row_var,     the same, but as the mean over draws of the variance ACROSS the 16
      scaled_within_row_var        keys of one draw (ddof 0); its expectation is 15/16 of the pooled one.
      unscaled_entropy,            mean softmax entropy (nats) of a score row; the maximum, a uniform
      scaled_entropy               spread over 16 keys, is ln 16 (``ln_n_keys``).  Unscaled rows
                                   collapse onto one key as d_k grows (entropy -> 0); scaled rows stay put.
      unscaled_max_prob, scaled_max_prob   mean largest attention weight of a row.
``ln_n_keys`` - ln 16, the entropy of uniform attention.

``temperature`` - list of records {tau, entropy, max_prob} for one score vector over 20 keys
    (N(0, score_std^2) entries, ``temperature_scores``) divided by tau before the softmax.  Small tau ->
    one key takes everything (entropy -> 0, max_prob -> 1); large tau -> uniform (entropy -> ln 20,
    ``ln_20``).

``normalisation`` - list of records, one per input vector: ``linear`` = x / sum(x) ("divide by the
    sum") next to ``softmax``; ``linear_n_negative`` counts negative weights (softmax never has any);
    ``*_max_over_min`` is the ratio of the largest to the smallest weight (None when the smallest
    linear weight is <= 0, where the ratio means nothing).  Softmax exaggerates differences: a gap of
    5 in the logits becomes a factor e^5.

``cost`` - list of records {T, qk_ms, mha_ms, qk_repeats, mha_repeats}: median wall time (ms) of the
    score matrix Q K^T (core.matmul_nt on T x d matrices) and of a full core.MultiHeadAttention forward
    (d = 32, 2 heads, no mask) for sequence length T.
``cost_fit`` - {"qk": {...}, "mha": {...}} with ``loglog_slope`` (least-squares slope of log t vs
    log T: 2 means pure T^2 scaling; the full forward is below 2 at small T because the projections
    cost only ~T), ``power_fit`` {c_ms, k, r2_log, ratio_fit_over_measured}: the same fit t = c T^k
    made in log space (R^2 of log t), and ``quadratic_fit`` {a_ms, b_ms, r2, ratio_fit_over_measured}
    of the linear-space fit t = a + b T^2 (the tutorial's; its R^2 is dominated by the largest T and
    hides misses by a large factor at small T, which ratio_fit_over_measured shows per T).

``gradient_check`` - list of records, one per module: {module, setup, n_params, n_failed, max_rel_err,
    max_abs_err, ok, seconds, worst_rel_param, worst_rel_param_abs_err}.  Central differences
    (eps = 1e-4) against the hand-written backward for EVERY parameter entry (core.gradient_check); an
    entry passes when rel err < 1e-5 or abs err < 1e-8; max_rel_err is taken over entries with
    |grad| >= 1e-6.  The finite differences themselves carry an error of order eps^2 ~ 1e-8 (times a
    third derivative), so abs errors of 1e-8..1e-12 mean the backward is right; a max_rel_err above
    1e-5 on an entry whose gradient is only ~1e-4 is that same 1e-9 abs error divided by a small
    number (worst_rel_param names the parameter, worst_rel_param_abs_err its max abs error).

``stability`` - {multiplier, sum, sum_str, max_abs_sum_minus_1, all_finite, records}: core.softmax_rows
    (max-subtracted, eq. 2.3) of logits multiplied by 1e3 - the two ``normalisation`` vectors and one
    draw of N(0, 1) logits; ``sum``/``sum_str`` are those of the record farthest from 1.  Each record: \
{logits_source, logits, probabilities, sum, sum_str (printed to 15 decimals),
    abs_sum_minus_1, all_finite, max_logit, naive_exp_overflows (whether exp(max logit) alone would
    overflow a float - exp overflows above ~709.78 - i.e. why the max is subtracted first)}.

``throughput`` - list of records {n, k, m, flops, matmul_s, naive_s, matmul_mflops, naive_mflops,
    speedup, max_abs_diff}: C = A B with A (n, k), B (k, m) through core.matmul (C-level iterators) and
    through a plain Python triple loop; best (minimum) time of interleaved repeats; flops = 2 n k m
    (``throughput_flops_definition``).  ``dot_impl`` names the inner-product kernel (math.sumprod on
    Python 3.12+, sum(map(mul)) before): the speed-up depends strongly on it and on the machine.

``checks`` - booleans the smoke tests assert (scaled variance within [0.8, 1.2] for every d_k,
    unscaled entropy strictly decreasing with d_k, every gradient check passed, ...).

Usage: python demos/demo_attention_basics.py [--seed 0]; QUICK=1 for the reduced configuration
(smaller gradient-check models, fewer timing repeats, output in figures/quick/).
"""
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import transformer as core
from bench_core import naive_matmul

FULL = {
    "scaling": {"d_k": [2, 8, 32, 128, 512], "n_keys": 16, "n_draws": 400},
    "temperature": {"n_keys": 20, "score_std": 2.0, "tau": [0.1, 0.5, 1.0, 2.0, 4.0]},
    "normalisation": {"vectors": [[1.0, 2.0, -3.0, 5.0], [1.0, 2.0, 3.0, 6.0]]},
    "cost": {"d": 32, "n_heads": 2, "T": [8, 16, 32, 64, 128, 256], "budget_s": 0.3,
             "min_repeats": 3, "max_repeats": 101},
    "gradient_check": {
        "eps": 1e-4, "rel_floor": 1e-6, "tolerance": "rel < 1e-5 or abs < 1e-8",
        "linear": {"d_in": 6, "d_out": 5, "T": 3},
        "layernorm": {"d": 6, "T": 3, "perturb_gamma_beta_std": 0.1},
        "mha": {"d": 8, "n_heads": 2, "causal": True, "T": 5},
        "ffn": {"d": 8, "d_ff": 17, "T": 5},      # the tutorial's 297 parameters = 2*8*17 + 17 + 8
        "lm": {"vocab_size": 12, "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "pos": "sine",
               "tie_weights": True, "seq_len": 5},
        "encdec": {"src_vocab_size": 12, "tgt_vocab_size": 12, "d_model": 16, "n_heads": 2, "n_layers": 1,
                   "d_ff": 32, "pos": "sine", "src_len": 4, "tgt_len": 4},
    },
    "stability": {"n_logits": 10, "multiplier": 1e3},
    "throughput": {"shapes": [[32, 32, 32], [64, 64, 64], [128, 128, 128]], "repeats": 5},
}

QUICK_OVERRIDES = {
    "cost": dict(FULL["cost"], budget_s=0.05, max_repeats=15),
    "gradient_check": dict(
        FULL["gradient_check"],
        lm={"vocab_size": 8, "d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "pos": "sine",
            "tie_weights": True, "seq_len": 5},
        encdec={"src_vocab_size": 8, "tgt_vocab_size": 8, "d_model": 8, "n_heads": 2, "n_layers": 1,
                "d_ff": 16, "pos": "sine", "src_len": 4, "tgt_len": 4}),
    "throughput": {"shapes": [[32, 32, 32], [64, 64, 64]], "repeats": 2},
}


# ----------------------------------------------------------------------------- small helpers


def _gauss_mat(rng, n, m, std=1.0):
    return [[rng.gauss(0.0, std) for _ in range(m)] for _ in range(n)]


def _entropy(p):
    """Shannon entropy in nats of a probability vector (0 ln 0 = 0)."""
    return -math.fsum(x * math.log(x) for x in p if x > 0.0)


def _var(xs, ddof=1):
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - ddof)


def _linfit(x, y):
    """Least squares y = a + b x; returns (a, b, R^2)."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((u - mx) ** 2 for u in x)
    sxy = sum((u - mx) * (v - my) for u, v in zip(x, y))
    b = sxy / sxx
    a = my - b * mx
    ss_res = sum((v - a - b * u) ** 2 for u, v in zip(x, y))
    ss_tot = sum((v - my) ** 2 for v in y)
    return a, b, 1.0 - ss_res / ss_tot


def _median_time(fn, budget_s, min_repeats, max_repeats):
    """Median wall time (s) of fn() over a number of repeats chosen to fit ``budget_s``."""
    t0 = time.perf_counter()
    fn()                                                    # warm-up, also sizes the repeat count
    first = time.perf_counter() - t0
    n = max(min_repeats, min(max_repeats, int(budget_s / max(first, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


# ----------------------------------------------------------------------------- sections


def scaling(cfg, rng):
    n_keys, n_draws = cfg["n_keys"], cfg["n_draws"]
    records = []
    for d_k in cfg["d_k"]:
        inv = 1.0 / math.sqrt(d_k)
        raw_rows = []
        for _ in range(n_draws):
            q = [rng.gauss(0.0, 1.0) for _ in range(d_k)]
            K = _gauss_mat(rng, n_keys, d_k)
            raw_rows.append(core.matmul_nt([q], K)[0])         # s_j = <q, k_j>   (1, n_keys)
        scaled_rows = core.scale_mat(raw_rows, inv)
        rec = {"d_k": d_k, "n_keys": n_keys, "n_draws": n_draws}
        for tag, rows in (("unscaled", raw_rows), ("scaled", scaled_rows)):
            A = core.softmax_rows(rows)
            pooled = [s for r in rows for s in r]
            rec[f"{tag}_var"] = _var(pooled)
            rec[f"{tag}_within_row_var"] = math.fsum(_var(r, ddof=0) for r in rows) / n_draws
            rec[f"{tag}_entropy"] = math.fsum(_entropy(a) for a in A) / n_draws
            rec[f"{tag}_max_prob"] = math.fsum(max(a) for a in A) / n_draws
        rec["ln_n_keys"] = math.log(n_keys)
        records.append(rec)
    return records


def temperature(cfg, rng):
    z = [rng.gauss(0.0, cfg["score_std"]) for _ in range(cfg["n_keys"])]
    records = []
    for tau in cfg["tau"]:
        p = core.softmax_rows([[x / tau for x in z]])[0]
        records.append({"tau": tau, "entropy": _entropy(p), "max_prob": max(p)})
    return z, records


def normalisation(cfg):
    records = []
    for x in cfg["vectors"]:
        total = sum(x)
        lin = [v / total for v in x]
        soft = core.softmax_rows([x])[0]
        records.append({
            "vector": x,
            "linear": lin,
            "softmax": soft,
            "linear_sum": math.fsum(lin),
            "softmax_sum": math.fsum(soft),
            "linear_n_negative": sum(v < 0 for v in lin),
            "softmax_n_negative": sum(v < 0 for v in soft),
            "linear_max": max(lin),
            "softmax_max": max(soft),
            "linear_max_over_min": max(lin) / min(lin) if min(lin) > 0 else None,
            "softmax_max_over_min": max(soft) / min(soft),
        })
    return records


def cost(cfg, rng, run):
    """Section 2.7, what attention costs: for each length T the median time of Q K^T (T^2 scores) and of the
    whole multi-head forward, with their log-log slopes and a fit t = a + b T^2."""
    d, H = cfg["d"], cfg["n_heads"]
    mha = core.MultiHeadAttention(d, H, rng=random.Random(rng.random()))
    records = []
    for T in cfg["T"]:
        Q, K, X = _gauss_mat(rng, T, d), _gauss_mat(rng, T, d), _gauss_mat(rng, T, d)
        t_qk, n_qk = _median_time(lambda: core.matmul_nt(Q, K), cfg["budget_s"], cfg["min_repeats"],
                                  cfg["max_repeats"])
        t_mha, n_mha = _median_time(lambda: mha.forward(X), cfg["budget_s"], cfg["min_repeats"],
                                    cfg["max_repeats"])
        records.append({"T": T, "qk_ms": 1e3 * t_qk, "mha_ms": 1e3 * t_mha,
                        "qk_repeats": n_qk, "mha_repeats": n_mha})
        run.log(f"  cost T={T}: QK^T {1e3 * t_qk:.3f} ms, MHA forward {1e3 * t_mha:.3f} ms")
    fits = {}
    Ts = [r["T"] for r in records]
    for key in ("qk", "mha"):
        ts = [r[f"{key}_ms"] for r in records]
        c, slope, r2_log = _linfit([math.log(T) for T in Ts], [math.log(t) for t in ts])
        a, b, r2 = _linfit([T * T for T in Ts], ts)
        fits[key] = {"loglog_slope": slope,
                     "power_fit": {"c_ms": math.exp(c), "k": slope, "r2_log": r2_log,
                                   "ratio_fit_over_measured": [math.exp(c) * T ** slope / t for T, t in zip(Ts, ts)]},
                     "quadratic_fit": {"a_ms": a, "b_ms": b, "r2": r2,
                                       "ratio_fit_over_measured": [(a + b * T * T) / t for T, t in zip(Ts, ts)]}}
    return records, fits


def _proj_loss(module, X, G):
    """loss(backward) for a (T, d) -> (T, d') module: L = sum(Y * G), so dL/dY = G."""
    def loss(backward):
        Y = module.forward(X)
        L = math.fsum(core.dot(y, g) for y, g in zip(Y, G))
        if backward:
            module.backward(G)
        return L
    return loss


def _layer_cases(cfg, rng):
    """Gradient-check cases of the layers (Linear, LayerNorm, causal attention, feed-forward), each
    (name, setup, loss(backward), params) with a random projection loss L = sum(Y * G)."""
    cases = []
    c = cfg["linear"]
    lin = core.Linear(c["d_in"], c["d_out"], rng=random.Random(rng.random()))
    X = _gauss_mat(rng, c["T"], c["d_in"])
    cases.append(("Linear", f"Linear({c['d_in']}, {c['d_out']}), input {c['T']}x{c['d_in']}",
                  _proj_loss(lin, X, _gauss_mat(rng, c["T"], c["d_out"])), lin.params()))

    c = cfg["layernorm"]
    ln = core.LayerNorm(c["d"])
    s = c["perturb_gamma_beta_std"]
    ln.gamma.data = [1.0 + rng.gauss(0.0, s) for _ in range(c["d"])]   # away from the init values,
    ln.beta.data = [rng.gauss(0.0, s) for _ in range(c["d"])]          # so gamma != 1 is exercised
    X = _gauss_mat(rng, c["T"], c["d"])
    cases.append(("LayerNorm", f"LayerNorm({c['d']}), gamma/beta perturbed, input {c['T']}x{c['d']}",
                  _proj_loss(ln, X, _gauss_mat(rng, c["T"], c["d"])), ln.params()))

    c = cfg["mha"]
    mha = core.MultiHeadAttention(c["d"], c["n_heads"], rng=random.Random(rng.random()), causal=c["causal"])
    X = _gauss_mat(rng, c["T"], c["d"])
    cases.append(("MultiHeadAttention (causal)",
                  f"MultiHeadAttention(d={c['d']}, H={c['n_heads']}, causal={c['causal']}), input {c['T']}x{c['d']}",
                  _proj_loss(mha, X, _gauss_mat(rng, c["T"], c["d"])), mha.params()))

    c = cfg["ffn"]
    ffn = core.FeedForward(c["d"], c["d_ff"], rng=random.Random(rng.random()))
    X = _gauss_mat(rng, c["T"], c["d"])
    cases.append(("FeedForward", f"FeedForward(d={c['d']}, d_ff={c['d_ff']}), input {c['T']}x{c['d']}",
                  _proj_loss(ffn, X, _gauss_mat(rng, c["T"], c["d"])), ffn.params()))
    return cases


def _model_cases(cfg, rng):
    """Gradient-check cases of the whole models: lm_loss of a TransformerLM, seq2seq_loss of an
    EncoderDecoder, each on random token ids."""
    cases = []
    c = dict(cfg["lm"])
    seq_len = c.pop("seq_len")
    lm = core.TransformerLM(seed=rng.randrange(2 ** 31), **c)
    ids = [rng.randrange(c["vocab_size"]) for _ in range(seq_len)]
    cases.append((f"TransformerLM ({c['n_layers']} layers)",
                  f"TransformerLM({c}), lm_loss on {seq_len} tokens",
                  lambda backward, m=lm, s=ids: core.lm_loss(m, s, backward=backward), lm.params()))

    c = dict(cfg["encdec"])
    src_len, tgt_len = c.pop("src_len"), c.pop("tgt_len")
    ed = core.EncoderDecoder(seed=rng.randrange(2 ** 31), **c)
    pair = ([rng.randrange(c["src_vocab_size"]) for _ in range(src_len)],
            [rng.randrange(c["tgt_vocab_size"]) for _ in range(tgt_len)])
    cases.append(("EncoderDecoder", f"EncoderDecoder({c}), seq2seq_loss on {src_len} -> {tgt_len} tokens",
                  lambda backward, m=ed, s=pair: core.seq2seq_loss(m, s, backward=backward), ed.params()))
    return cases


def gradient_checks(cfg, rng, run):
    """Every case's backward against central finite differences (core.gradient_check): one record per
    module with its worst relative and absolute errors."""
    eps, floor = cfg["eps"], cfg["rel_floor"]
    cases = _layer_cases(cfg, rng) + _model_cases(cfg, rng)
    records = []
    for name, setup, loss_fn, params in cases:
        t0 = time.perf_counter()
        rep = core.gradient_check(loss_fn, params, eps=eps, rel_floor=floor)
        dt = time.perf_counter() - t0
        worst = max(rep["per_param"].items(), key=lambda kv: kv[1]["max_rel_err"])
        records.append({"module": name, "setup": setup, "n_params": rep["n_params"],
                        "n_failed": rep["n_failed"], "max_rel_err": rep["max_rel_err"],
                        "max_abs_err": rep["max_abs_err"], "ok": rep["ok"], "seconds": dt,
                        "worst_rel_param": worst[0], "worst_rel_param_abs_err": worst[1]["max_abs_err"]})
        run.log(f"  gradient check {name}: {rep['n_params']} params, {rep['n_failed']} failed, "
                f"max rel {rep['max_rel_err']:.2e}, max abs {rep['max_abs_err']:.2e} ({dt:.1f} s)")
    return records


def stability(cfg, vectors, rng):
    """Softmax of large logits: the normalisation vectors and one N(0, 1) draw, times the multiplier."""
    mult = cfg["multiplier"]
    sources = [(f"{v} x {mult:g}", v) for v in vectors]
    draws = [rng.gauss(0.0, 1.0) for _ in range(cfg["n_logits"])]
    sources.append((f"{cfg['n_logits']} N(0, 1) draws x {mult:g}", draws))
    records = []
    for label, v in sources:
        z = [mult * x for x in v]
        p = core.softmax_rows([z])[0]
        total = math.fsum(p)
        try:
            math.exp(max(z))                                   # what a softmax without the max shift meets first
            overflow = False
        except OverflowError:
            overflow = True
        records.append({"logits_source": label, "logits": z, "probabilities": p, "sum": total,
                        "sum_str": f"{total:.15f}", "abs_sum_minus_1": abs(total - 1.0),
                        "all_finite": all(math.isfinite(x) for x in p), "max_logit": max(z),
                        "naive_exp_overflows": overflow})
    worst = max(records, key=lambda r: r["abs_sum_minus_1"])
    return {"multiplier": mult, "sum": worst["sum"], "sum_str": worst["sum_str"],
            "max_abs_sum_minus_1": worst["abs_sum_minus_1"],
            "all_finite": all(r["all_finite"] for r in records), "records": records}


def throughput(cfg, rng):
    records = []
    for n, k, m in cfg["shapes"]:
        A, B = _gauss_mat(rng, n, k), _gauss_mat(rng, k, m)
        flops = 2 * n * k * m
        fast, naive = [], []
        for _ in range(cfg["repeats"]):                        # interleaved, so both see the same machine load
            fast.append(_timed(lambda: core.matmul(A, B)))
            naive.append(_timed(lambda: naive_matmul(A, B)))
        t_fast, t_naive = min(fast), min(naive)
        C1, C2 = core.matmul(A, B), naive_matmul(A, B)
        diff = max(abs(x - y) for r1, r2 in zip(C1, C2) for x, y in zip(r1, r2))
        records.append({"n": n, "k": k, "m": m, "flops": flops, "matmul_s": t_fast, "naive_s": t_naive,
                        "matmul_mflops": flops / t_fast / 1e6, "naive_mflops": flops / t_naive / 1e6,
                        "speedup": t_naive / t_fast, "max_abs_diff": diff})
    return records


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- main


def summary_checks(results):
    """The booleans of the smoke tests, from the measured sections of ``results``."""
    sc = results["scaling"]
    ent = [r["unscaled_entropy"] for r in sc]
    return {
        "scaled_var_within_0.8_1.2": all(0.8 <= r["scaled_var"] <= 1.2 for r in sc),
        "unscaled_entropy_decreasing": all(a > b for a, b in zip(ent, ent[1:])),
        "scaled_entropy_above_unscaled": all(r["scaled_entropy"] > r["unscaled_entropy"] for r in sc),
        "all_gradient_checks_pass": all(r["ok"] for r in results["gradient_check"]),
        "softmax_x1e3_sums_to_1": results["stability"]["max_abs_sum_minus_1"] < 1e-12
                                  and results["stability"]["all_finite"],
        "softmax_never_negative": all(r["softmax_n_negative"] == 0 for r in results["normalisation"]),
    }


def main():
    args, config, run = common.start("attention", __doc__, FULL, QUICK_OVERRIDES)
    rng = random.Random(args.seed)
    n = 7
    results = {}

    run.stage(1, n, "scaling of q.k with d_k (variance, softmax entropy)")
    results["scaling"] = scaling(config["scaling"], rng)
    results["ln_n_keys"] = math.log(config["scaling"]["n_keys"])
    for r in results["scaling"]:
        run.log(f"  d_k={r['d_k']:4d}: var {r['unscaled_var']:8.2f} -> {r['scaled_var']:.3f}, "
                f"entropy {r['unscaled_entropy']:.3f} -> {r['scaled_entropy']:.3f} (ln 16 = {r['ln_n_keys']:.3f})")

    run.stage(2, n, "temperature and softmax vs divide-by-the-sum")
    results["temperature_scores"], results["temperature"] = temperature(config["temperature"], rng)
    results["ln_20"] = math.log(config["temperature"]["n_keys"])
    results["normalisation"] = normalisation(config["normalisation"])
    for r in results["temperature"]:
        run.log(f"  tau={r['tau']}: entropy {r['entropy']:.3f}, max prob {r['max_prob']:.3f}")

    run.stage(3, n, "cost of Q K^T and of a multi-head attention forward vs T")
    results["cost"], results["cost_fit"] = cost(config["cost"], rng, run)
    f = results["cost_fit"]
    run.log(f"  log-log slopes: QK^T {f['qk']['loglog_slope']:.2f}, MHA {f['mha']['loglog_slope']:.2f}; "
            f"R^2 of t = a + b T^2: QK^T {f['qk']['quadratic_fit']['r2']:.4f}, "
            f"MHA {f['mha']['quadratic_fit']['r2']:.4f}")

    run.stage(4, n, "gradient checks (central differences, every parameter)")
    results["gradient_check"] = gradient_checks(config["gradient_check"], rng, run)

    run.stage(5, n, "numerical stability of the softmax")
    results["stability"] = stability(config["stability"], config["normalisation"]["vectors"], rng)
    for r in results["stability"]["records"]:
        run.log(f"  softmax of {r['logits_source']} sums to {r['sum_str']} "
                f"(exp(max logit) alone would {'overflow' if r['naive_exp_overflows'] else 'not overflow'})")

    run.stage(6, n, "matmul throughput vs a naive triple loop")
    results["throughput"] = throughput(config["throughput"], rng)
    results["throughput_flops_definition"] = ("flops = 2*n*k*m for C = A B, A (n, k), B (k, m); "
                                              "Mflop/s = flops / seconds / 1e6")
    results["dot_impl"] = core.DOT_IMPL
    for r in results["throughput"]:
        run.log(f"  {r['n']}x{r['k']}x{r['m']}: matmul {r['matmul_mflops']:.1f} Mflop/s, "
                f"naive {r['naive_mflops']:.1f} Mflop/s ({r['speedup']:.1f}x)")

    run.stage(7, n, "summary checks")
    results["checks"] = summary_checks(results)
    run.log(f"  checks: {results['checks']}")
    run.finish(results)


if __name__ == "__main__":
    main()
