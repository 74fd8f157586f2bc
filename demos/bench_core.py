"""Speed of the core engine on this machine: measure before and after every change to the hot path.

Prints, and writes bench_core_py<major>.<minor>.json: with --save into the results folder the README's Speed
table reads (figures/, figures/quick/ under QUICK=1, $RESULTS_DIR when set, as the demos); with --out DIR into
DIR; otherwise into $RESULTS_DIR or the untracked figures/quick/, so a plain run never overwrites the
committed figures/bench_core_py*.json.  It measures:
  * the wall time of the gradient-check suite (python tests_transformer.py, in a subprocess);
  * Mflop/s of ``transformer.matmul`` against a naive triple loop for (40x48)@(48x96),
    (40x96)@(96x48) and 128^3 (flops counted as 2 n k m);
  * ms per training step (forward + backward + Adam) of a d=48, 4-head, 2-layer tied TransformerLM
    (V=40, d_ff=96) on a 40-token sequence; per-sequence time through ``transformer.train`` with
    1 and with 2 worker processes (batch 16, worker start-up included) and the speed-up;
  * the same step at Karpathy's microgpt shape (V=27, d=16, 4 heads, 1 layer, block 16);
  * when torch is importable: the same two model shapes in PyTorch on the CPU with one thread
    (float32, PyTorch's default), and how many times faster it is;
  * generation: sampling 40 tokens from the d=48 LM and greedy decoding of 30 tokens from a d=48
    2+2-layer EncoderDecoder with a 40-token source, with the K/V cache and without (the plain path
    re-runs the whole prefix per token); and ``parallel_map`` over 200 samples with 1 and 2 workers;
  * a scalar-autograd step (one Python object per number, micrograd style, written in
    demos/scalar_autograd.py) at microgpt's shape, timed in the same run as our list-of-rows step.

Usage:  python demos/bench_core.py            (QUICK=1 for fewer repeats; writes figures/quick/)
        python demos/bench_core.py --save     (updates figures/bench_core_py<X.Y>.json for the README;
                                               run_all.py --bench does this)
Run it under each interpreter you care about (e.g. PYENV_VERSION=3.13.0 python3 demos/bench_core.py --save).
"""
import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import scalar_autograd
import transformer as core
import safe_io

REPS = 3 if common.QUICK else 9


def median_time(fn, reps=REPS, warmup=1):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def naive_matmul(A, B):
    """The textbook triple loop, one Python multiply-add at a time: the baseline core.matmul is timed against
    (here and in experiment 1, demos/demo_attention_basics.py)."""
    n, k, m = len(A), len(B), len(B[0])
    C = [[0.0] * m for _ in range(n)]
    for i in range(n):
        Ai, Ci = A[i], C[i]
        for j in range(m):
            s = 0.0
            for p in range(k):
                s += Ai[p] * B[p][j]
            Ci[j] = s
    return C


def bench_matmul(rng):
    rows = []
    for n, k, m in ((40, 48, 96), (40, 96, 48), (128, 128, 128)):
        A = [[rng.gauss(0, 1) for _ in range(k)] for _ in range(n)]
        B = [[rng.gauss(0, 1) for _ in range(m)] for _ in range(k)]
        flops = 2 * n * k * m
        t_lib = median_time(lambda: core.matmul(A, B))
        t_naive = median_time(lambda: naive_matmul(A, B), reps=max(1, REPS // 3))
        rows.append({"shape": f"({n}x{k})@({k}x{m})", "flops": flops,
                     "matmul_mflops": flops / t_lib / 1e6, "naive_mflops": flops / t_naive / 1e6,
                     "ratio": t_naive / t_lib})
        print(f"  matmul {rows[-1]['shape']:>20}: {rows[-1]['matmul_mflops']:7.1f} Mflop/s   naive "
              f"{rows[-1]['naive_mflops']:6.1f} Mflop/s   ({rows[-1]['ratio']:.1f}x)", flush=True)
    return rows


def lm_step_ms(cfg, T, rng):
    """Median ms of one forward + backward + Adam step on one sequence of T tokens."""
    lm = core.TransformerLM(**cfg)
    ids = [rng.randrange(cfg["vocab_size"]) for _ in range(T + 1)]
    opt = core.Adam(lm.params(), lr=1e-3)

    def step():
        lm.zero_grad()
        core.lm_loss(lm, ids)
        opt.step()
    return 1000 * median_time(step), core.param_count(lm)


def train_per_sequence_ms(cfg, T, workers, rng, steps):
    """ms per sequence through core.train (batch 16, ``steps`` steps), worker start-up included."""
    data = [[rng.randrange(cfg["vocab_size"]) for _ in range(T + 1)] for _ in range(16 * steps)]
    lm = core.TransformerLM(**cfg)
    t0 = time.perf_counter()
    core.train(lm, data, core.lm_loss, epochs=1, batch_size=16, workers=workers, verbose=False)
    return 1000 * (time.perf_counter() - t0) / len(data)


def torch_step_ms(cfg, T):
    """The same architecture written with torch ops (Pre-LN, causal SDPA, tanh GELU), one thread."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(1)
    torch.manual_seed(0)
    V, d, H, L, f = cfg["vocab_size"], cfg["d_model"], cfg["n_heads"], cfg["n_layers"], cfg["d_ff"]
    P = torch.nn.ParameterList()

    def par(*shape, zero=False, one=False):
        t = torch.ones(*shape) if one else (torch.zeros(*shape) if zero else 0.1 * torch.randn(*shape))
        p = torch.nn.Parameter(t)
        P.append(p)
        return p
    E = par(V, d)
    layers = [dict(g1=par(d, one=True), b1=par(d, zero=True), Wqkv=par(d, 3 * d), bqkv=par(3 * d, zero=True),
                   Wo=par(d, d), bo=par(d, zero=True), g2=par(d, one=True), b2=par(d, zero=True),
                   W1=par(d, f), c1=par(f, zero=True), W2=par(f, d), c2=par(d, zero=True)) for _ in range(L)]
    gf, bf = par(d, one=True), par(d, zero=True)
    pe = torch.zeros(T, d)
    if cfg.get("pos") == "sine":
        pe = torch.tensor(core.sine_cosine_table(T, d), dtype=torch.float32)
    elif cfg.get("pos") == "learned":
        pe = par(T, d)
    opt = torch.optim.Adam(P.parameters(), lr=1e-3)
    ids = torch.randint(0, V, (T + 1,))

    def step():
        opt.zero_grad()
        x = E[ids[:-1]] + pe
        for ly in layers:
            h = F.layer_norm(x, (d,), ly["g1"], ly["b1"])
            q, k, v = (h @ ly["Wqkv"] + ly["bqkv"]).view(T, 3, H, d // H).permute(1, 2, 0, 3)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, d)
            x = x + a @ ly["Wo"] + ly["bo"]
            h = F.layer_norm(x, (d,), ly["g2"], ly["b2"])
            x = x + F.gelu(h @ ly["W1"] + ly["c1"], approximate="tanh") @ ly["W2"] + ly["c2"]
        logits = F.layer_norm(x, (d,), gf, bf) @ E.T
        F.cross_entropy(logits, ids[1:]).backward()
        opt.step()
    return 1000 * median_time(step, reps=max(REPS, 20), warmup=3)


def bench_generation(rng):
    """Cached vs plain decoding, and parallel_map's scaling, on the experiment-sized models."""
    reps = max(1, REPS // 3)
    lm = core.TransformerLM(40, d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=128, pos="sine",
                          tie_weights=True, seed=1)
    s2s = core.EncoderDecoder(40, 40, d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=128, pos="sine", seed=2)
    src = [rng.randrange(40) for _ in range(40)]
    out = {}
    cases = {"lm_sample_40": (lambda c: core.sample(lm, [0], 40, rng=3, use_cache=c), 40),
             "seq2seq_greedy_30": (lambda c: core.greedy_decode(s2s, [0], 30, src=src, use_cache=c), 30)}
    for name, (fn, n_tok) in cases.items():
        assert fn(True) == fn(False), f"{name}: cached and plain decoding disagree"
        t_c, t_p = median_time(lambda: fn(True), reps=reps), median_time(lambda: fn(False), reps=reps, warmup=0)
        out[name] = {"cached_s": t_c, "plain_s": t_p, "speedup": t_p / t_c, "tokens": n_tok,
                     "cached_tokens_per_s": n_tok / t_c, "plain_tokens_per_s": n_tok / t_p}
        print(f"  {name}: cached {t_c:.3f} s ({n_tok / t_c:.0f} tokens/s), plain {t_p:.3f} s "
              f"({n_tok / t_p:.0f} tokens/s): {t_p / t_c:.1f}x", flush=True)
    n = 40 if common.QUICK else 200
    def draw(item, r):
        return core.sample(lm, [0], 20, rng=r)
    t1 = median_time(lambda: core.parallel_map(draw, range(n), workers=1), reps=1, warmup=0)
    t2 = median_time(lambda: core.parallel_map(draw, range(n), workers=2), reps=1, warmup=0)
    out["parallel_map"] = {"items": n, "tokens_per_item": 20, "one_worker_s": t1, "two_workers_s": t2,
                           "speedup": t1 / t2}
    print(f"  parallel_map, {n} samples of 20 tokens: {t1:.2f} s with 1 worker, {t2:.2f} s with 2 "
          f"({t1 / t2:.2f}x)", flush=True)
    return out


def bench_suite():
    """Wall time of the gradient-check suite (python tests_transformer.py, in a subprocess)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.join(common.ROOT, "tests_transformer.py")],
                          capture_output=True, text=True)
    suite = {"wall_time_s": time.perf_counter() - t0, "last_line": proc.stdout.strip().splitlines()[-1],
             "returncode": proc.returncode}
    print(f"  test suite: {suite['last_line']} in {suite['wall_time_s']:.2f} s", flush=True)
    return suite


SHAPES = {
    "d48_lm": (dict(vocab_size=40, d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=64, pos="sine",
                    tie_weights=True), 40),
    "microgpt": (dict(vocab_size=27, d_model=16, n_heads=4, n_layers=1, d_ff=64, max_len=16, pos="learned",
                      tie_weights=False), 16),
}


def bench_shape(name, cfg, T, rng):
    """One model shape: our training step; for d48_lm also through train() with 1 and 2 workers; the
    PyTorch step when torch is importable; for microgpt also the scalar-autograd step."""
    ms, n = lm_step_ms(cfg, T, rng)
    rec = {"config": cfg, "T": T, "params": n, "step_ms": ms}
    print(f"  {name}: {n} params, T={T}: {ms:.1f} ms per step (forward + backward + Adam)", flush=True)
    if name == "d48_lm":
        steps = 2 if common.QUICK else 4
        one = train_per_sequence_ms(cfg, T, 1, rng, steps)
        two = train_per_sequence_ms(cfg, T, 2, rng, steps)
        rec.update(train_ms_per_seq_1_worker=one, train_ms_per_seq_2_workers=two, speedup_2_workers=one / two)
        print(f"  {name} through train(), batch 16: {one:.1f} ms/sequence with 1 worker, {two:.1f} with 2 "
              f"({one / two:.2f}x)", flush=True)
    t_ms = torch_step_ms(cfg, T)
    if t_ms is not None:
        import torch
        rec.update(torch_step_ms=t_ms, torch_version=torch.__version__, torch_dtype="float32",
                   torch_threads=1, slowdown_vs_torch=ms / t_ms)
        print(f"  {name} in PyTorch {torch.__version__} (CPU, 1 thread, float32): {t_ms:.2f} ms per step; "
              f"pure Python is {ms / t_ms:.0f}x slower", flush=True)
    if name == "microgpt":                         # the same shape with one Python object per number
        sm = scalar_autograd.ScalarLM(V=cfg["vocab_size"], d=cfg["d_model"], H=cfg["n_heads"],
                                      L=cfg["n_layers"], d_ff=cfg["d_ff"], T=T)
        ids = [rng.randrange(cfg["vocab_size"]) for _ in range(T + 1)]
        s_ms = 1000 * median_time(lambda: sm.step(ids), reps=max(1, REPS // 3))
        rec.update(scalar_autograd_step_ms=s_ms, scalar_autograd_params=len(sm.params()),
                   scalar_over_lists=s_ms / ms)
        print(f"  {name} with scalar autograd (demos/scalar_autograd.py, {len(sm.params())} params): "
              f"{s_ms:.0f} ms per step, {s_ms / ms:.0f}x our list-of-rows step", flush=True)
    return rec


def out_path(args, py):
    """Where the results go: --out DIR, else --save's results folder, else $RESULTS_DIR or figures/quick/."""
    major_minor = ".".join(py.split(".")[:2])
    if args.out:
        folder = args.out
    elif args.save:
        folder = common.default_out_dir()
    else:
        folder = os.environ.get("RESULTS_DIR") or os.path.join(common.FIGURES, "quick")
    return os.path.join(folder, f"bench_core_py{major_minor}.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--save", action="store_true",
                       help="write into the results folder the README reads (figures/, or $RESULTS_DIR)")
    where.add_argument("--out", metavar="DIR", help="write into DIR instead")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    common.exit_130_on_ctrl_c()
    rng = random.Random(0)
    py = platform.python_version()
    print(f"bench_core: Python {py} ({core.DOT_IMPL}), {os.cpu_count()} cores, "
          f"{'QUICK' if common.QUICK else 'full'}", flush=True)
    out = {"python": py, "dot_impl": core.DOT_IMPL, "cpu_count": os.cpu_count(), "platform": platform.platform(),
           "quick": common.QUICK, "reps": REPS}
    out["suite"] = bench_suite()
    out["matmul"] = bench_matmul(rng)
    out["steps"] = {name: bench_shape(name, cfg, T, rng) for name, (cfg, T) in SHAPES.items()}
    out["generation"] = bench_generation(rng)
    path = out_path(args, py)
    safe_io.write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
