"""Parity suite: every hand-written forward and backward in transformer.py against PyTorch autograd.

Finite differences (tests_transformer.py) prove that each backward is the derivative of its own
forward.  They cannot catch a forward that computes the wrong function (a mask on the wrong side,
RoPE applied to V, a wrong GELU constant, a biased/unbiased variance mix-up).  This file rebuilds
every component from torch.nn.functional / plain tensor ops (written here from the conventions in
transformer.py's docstrings, never by calling our code), copies the weights over, runs forward and
backward with the same upstream gradient in float64, and requires

    max |ours - torch| <= 1e-10

for the outputs, for EVERY parameter gradient and for the input gradient(s) wherever the module
takes a float input.  The optimiser, clipping and the schedules are compared the same way.

The file reads: the torch twin of each layer (``ref_*``, each naming the tutorial's equation), then the
plumbing of the comparison (``check`` and the table), then the tests, layer by layer up to whole models.

Run:
    python -m pytest tests/tests_parity_torch.py -v                 # table of max abs diffs at the end
    PARITY_REPORT=parity.json python -m pytest tests/tests_parity_torch.py   # ... and the table as JSON
    REQUIRE_TORCH=1 python -m pytest tests/tests_parity_torch.py    # CI: a missing torch is an error, not a skip

Only pytest collects this file (t_* functions, see pyproject.toml); transformer.py itself never
imports torch.  torch's default dtype is left alone (every tensor here is created as float64);
the one global touched, torch's intra-op thread count, is set to 1 for this module and restored.
"""
import math
import os
import random
import sys
import time
import zlib

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import transformer as core
import safe_io

if os.environ.get("REQUIRE_TORCH", "").strip().lower() in ("1", "true", "yes"):
    import torch
else:
    torch = pytest.importorskip(
        "torch", reason="PyTorch is not installed: the parity suite needs it "
                        "(pip install torch==2.13.0, as the README says)")
import torch.nn.functional as F

DT = torch.float64
TOL = 1e-10

# ============================================================================= the torch side
# The readable torch twin of each layer: the same computation written a second time, from the conventions
# stated in transformer.py, with torch ops only (never calling our code).  Autograd then gives the
# backward each hand-written one is compared with.  The bookkeeping of the comparison comes after them.


def leaf(x):
    """A float64 leaf tensor that collects a gradient."""
    return torch.tensor(x, dtype=DT, requires_grad=True)


def const(x):
    """A float64 constant tensor (no gradient)."""
    return torch.tensor(x, dtype=DT)


def dropped(D, key, X):
    """Section 5.6 with given masks: X * D[key] when the dropout masks D (name -> tensor of 0 and 1/(1-p),
    the masks our training forward drew) hold one for ``key``; X otherwise (no dropout)."""
    return X * D[key] if D and key in D else X


def ref_linear(P, name, X):
    """Y = X W + b with W (d_in, d_out); autograd gives eq. (2.15), dW = X^T dY.  F.linear takes the
    (d_out, d_in) weight, hence W.T."""
    return F.linear(X, P[name + ".W"].T, P.get(name + ".b"))


def ref_layer_norm(P, name, X):
    """eq. (5.7): LayerNorm per row with the biased variance and eps = 1e-5 (F.layer_norm); autograd gives
    the backward of eq. (5.11)."""
    return F.layer_norm(X, (X.shape[-1],), P[name + ".gamma"], P[name + ".beta"], eps=1e-5)


def ref_ffn(P, name, X, D=None):
    """eqs. (5.1)/(5.2): FFN(x) = GELU(x W1 + b1) W2 + b2, GELU in its tanh form; the hidden layer times
    its dropout mask when D has one."""
    G = F.gelu(ref_linear(P, name + ".fc1", X), approximate="tanh")
    return ref_linear(P, name + ".fc2", dropped(D, name + ".drop", G))


def ref_rope(X):
    """eq. (4.7): RoPE on (..., T, d_h): row t at position t, pairs (2j, 2j+1) rotated by
    t * 10000^(-2j/d_h)."""
    T, dh = X.shape[-2], X.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, dh, 2, dtype=DT) / dh)          # (d_h/2,)
    ang = torch.arange(T, dtype=DT)[:, None] * inv_freq[None, :]            # (T, d_h/2)
    c, s = torch.cos(ang), torch.sin(ang)
    x, y = X[..., 0::2], X[..., 1::2]
    return torch.stack((x * c - y * s, x * s + y * c), dim=-1).flatten(-2)  # re-interleave pairs


def ref_sine_table(T, d):
    """eq. (4.4): PE[t][i] = sin(t w_i) for even i, PE[t][i+1] = cos(t w_i), w_i = 10000^(-i/d), i even."""
    pos = torch.arange(T, dtype=DT)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=DT) / d)
    pe = torch.zeros(T, d, dtype=DT)
    pe[:, 0::2] = torch.sin(pos * w)
    pe[:, 1::2] = torch.cos(pos * w)[:, : d // 2]
    return pe


def ref_attention(P, name, X, memory=None, H=1, causal=False, rope=False, kpm=None, impl="sdpa", D=None):
    """Multi-head attention, whose autograd is eqs. (2.11)-(2.16), with the causal mask of eq. (6.1).
    Self: one projection qkv (d -> 3d) = [Q | K | V]; cross: q on X and kv (d -> 2d) = [K | V] on memory.
    Head h = columns h d_h:(h+1) d_h.  kpm: True = padded key.

    impl="sdpa" uses F.scaled_dot_product_attention (boolean mask, True = may attend);
    impl="explicit" writes softmax(Q K^T / sqrt(d_h) + mask) V out, and gives a query whose keys are
    all masked a zero output (the library's convention; softmax over all -inf would be NaN).
    With dropout masks D (H, T, S) for this layer: explicit, and A times the mask after the softmax."""
    if D and name + ".drop" in D:
        impl = "explicit"
    d = X.shape[1]
    dh = d // H
    if memory is None:
        Q, K, V = ref_linear(P, name + ".qkv", X).split(d, dim=1)
    else:
        Q = ref_linear(P, name + ".q", X)
        K, V = ref_linear(P, name + ".kv", memory).split(d, dim=1)
    T, S = Q.shape[0], K.shape[0]

    def heads(Z):                                                           # (n, d) -> (H, n, d_h)
        return Z.reshape(Z.shape[0], H, dh).transpose(0, 1)
    Q, K, V = heads(Q), heads(K), heads(V)
    if rope:
        Q, K = ref_rope(Q), ref_rope(K)                                         # never V
    allowed = torch.ones(T, S, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    if kpm is not None:
        allowed = allowed & ~torch.tensor(kpm, dtype=torch.bool)[None, :]   # mask KEYS (columns)
    if impl == "sdpa":
        O = F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed)
    else:
        Sc = (Q @ K.transpose(-1, -2)) / math.sqrt(dh)
        Sc = Sc.masked_fill(~allowed, float("-inf"))
        live = allowed.any(dim=-1, keepdim=True)                            # (T, 1)
        A = torch.softmax(torch.where(live, Sc, torch.zeros_like(Sc)), dim=-1) * live
        O = dropped(D, name + ".drop", A) @ V
    return ref_linear(P, name + ".o", O.transpose(0, 1).reshape(T, d))


def ref_encoder_block(P, name, X, H, rope=False, causal=False, kpm=None, impl="sdpa", D=None):
    """eq. (5.4), Pre-LN: X1 = X + MHA(LN1 X); Y = X1 + FFN(LN2 X1); with dropout masks D each branch's
    output times its mask (name.drop0, name.drop1) before the residual add."""
    A = ref_attention(P, name + ".attn", ref_layer_norm(P, name + ".ln1", X), H=H, causal=causal,
                      rope=rope, kpm=kpm, impl=impl, D=D)
    X1 = X + dropped(D, name + ".drop0", A)
    return X1 + dropped(D, name + ".drop1", ref_ffn(P, name + ".ffn", ref_layer_norm(P, name + ".ln2", X1), D))


def ref_decoder_block(P, name, X, H, memory=None, rope=False, mkpm=None, impl="sdpa", D=None):
    """eq. (5.4), Pre-LN: X1 = X + causal MHA(LN1 X); X2 = X1 + cross MHA(LN2 X1, memory);
    Y = X2 + FFN(LN3 X2); with dropout masks D each branch's output times its mask (name.drop0..2)."""
    A = ref_attention(P, name + ".self_attn", ref_layer_norm(P, name + ".ln1", X), H=H, causal=True,
                      rope=rope, impl=impl, D=D)
    X = X + dropped(D, name + ".drop0", A)
    if memory is not None:                                                  # cross-attention: no RoPE
        C = ref_attention(P, name + ".cross_attn", ref_layer_norm(P, name + ".ln2", X), memory=memory,
                          H=H, kpm=mkpm, impl=impl, D=D)
        X = X + dropped(D, name + ".drop1", C)
    return X + dropped(D, name + ".drop2", ref_ffn(P, name + ".ffn", ref_layer_norm(P, name + ".ln3", X), D))


def ref_embed(P, name, ids, pos, d, features=None, D=None):
    """Token embedding rows E[ids] (+ F[ids] W_f with token features) + positions: the sine table of eq.
    (4.4), a learned table, or nothing (none; RoPE acts in attention)."""
    X = F.embedding(torch.tensor(ids, dtype=torch.long), P[name + ".tok.W"])
    if features is not None:                                                # + F[ids] W_f (F fixed)
        X = X + const([features[i] for i in ids]) @ P[name + ".feat.W"]
    if pos == "sine":
        X = X + ref_sine_table(len(ids), d)
    elif pos == "learned":
        X = X + P[name + ".pos.W"][: len(ids)]
    return dropped(D, name + ".drop", X)                                    # none / rope: nothing added


def _pad_mask(ids, pad_id):
    """The key-padding mask of ids (True = pad), None when nothing is padded, as transformer.padding_mask
    states it."""
    if pad_id is None:
        return None
    m = [i == pad_id for i in ids]
    return m if any(m) else None


def ref_encoder_model(P, c, ids, D=None):
    """TransformerEncoder: embed, blocks, ln_f, mean over non-pad positions, linear head."""
    kpm = _pad_mask(ids, c["pad_id"])
    X = ref_embed(P, "embed", ids, c["pos"], c["d_model"], c.get("token_features"), D=D)
    for i in range(c["n_layers"]):
        X = ref_encoder_block(P, f"blocks.{i}", X, c["n_heads"], rope=c["pos"] == "rope", kpm=kpm, D=D)
    Hs = ref_layer_norm(P, "ln_f", X)
    if kpm is not None:
        Hs = Hs[~torch.tensor(kpm, dtype=torch.bool)]
    return ref_linear(P, "head", Hs.mean(dim=0, keepdim=True))[0]


def ref_lm(P, c, ids, head_E=None, D=None):
    """TransformerLM: embed, causal blocks (no cross), ln_f, logits = H E^T (tied: its autograd is the
    two-path embedding gradient of eq. (8.5)) or the head."""
    X = ref_embed(P, "embed", ids, c["pos"], c["d_model"], D=D)
    for i in range(c["n_layers"]):
        X = ref_decoder_block(P, f"blocks.{i}", X, c["n_heads"], rope=c["pos"] == "rope", D=D)
    Hs = ref_layer_norm(P, "ln_f", X)
    if c["tie_weights"]:
        return Hs @ (P["embed.tok.W"] if head_E is None else head_E).T
    return ref_linear(P, "head", Hs)


def ref_seq2seq(P, c, src, tgt_in, D=None):
    """EncoderDecoder: encoder (padded source keys masked) -> memory; decoder with cross-attention."""
    kpm = _pad_mask(src, c["src_pad_id"])
    rope, H, d = c["pos"] == "rope", c["n_heads"], c["d_model"]
    X = ref_embed(P, "src_embed", src, c["pos"], d, D=D)
    for i in range(c["n_layers"]):
        X = ref_encoder_block(P, f"enc.{i}", X, H, rope=rope, kpm=kpm, D=D)
    M = ref_layer_norm(P, "enc_ln", X)
    Y = ref_embed(P, "tgt_embed", tgt_in, c["pos"], d, D=D)
    for i in range(c["n_layers"]):
        Y = ref_decoder_block(P, f"dec.{i}", Y, H, memory=M, rope=rope, mkpm=kpm, D=D)
    return ref_linear(P, "head", ref_layer_norm(P, "dec_ln", Y))


# ============================================================================= the comparison
# check() compares ours with torch and records the result for the table printed at the end:
# component -> {"max_abs_diff", "checks" (node ids), "n_compared"}; check -> {...}

_COMPONENTS = {}
_CHECKS = {}
_CURRENT = {"check": "?"}


class _ParityTable:
    """Late-registered pytest plugin: prints the per-component table in the terminal summary."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _COMPONENTS:
            return
        tr = terminalreporter
        tr.section(f"parity with PyTorch {torch.__version__} (float64, tolerance {TOL:.0e})")
        w = max(len(c) for c in _COMPONENTS) + 2
        tr.write_line(f"{'component':<{w}}{'max abs diff':>14}{'checks':>8}{'arrays':>8}")
        for comp, r in _COMPONENTS.items():
            tr.write_line(f"{comp:<{w}}{r['max_abs_diff']:>14.3e}{len(r['checks']):>8}{r['n_compared']:>8}")
        if tr.config.get_verbosity() >= 0:      # -v (the project adds -q): one line per check too
            tr.write_line("")
            w2 = max(len(n) for n in _CHECKS) + 2
            tr.write_line(f"{'check':<{w2}}{'max abs diff':>14}  worst array")
            for n, r in _CHECKS.items():
                tr.write_line(f"{n:<{w2}}{r['max_abs_diff']:>14.3e}  {r['worst']}")
        worst = max(r["max_abs_diff"] for r in _COMPONENTS.values())
        tr.write_line(f"{len(_CHECKS)} parity checks, {sum(r['n_compared'] for r in _COMPONENTS.values())} "
                      f"arrays compared, overall max abs diff {worst:.3e}")


def _finite(x):
    return x if math.isfinite(x) else "inf"          # a failed (NaN/inf) comparison stays JSON-safe


def _report_json(elapsed):
    return {
        "tolerance": TOL,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "n_checks": len(_CHECKS),
        "n_arrays_compared": sum(r["n_compared"] for r in _COMPONENTS.values()),
        "max_abs_diff": _finite(max((r["max_abs_diff"] for r in _COMPONENTS.values()), default=0.0)),
        "checks_wall_time_s": round(elapsed, 3),      # first parity check to last (no import)
        "components": {c: {"max_abs_diff": _finite(r["max_abs_diff"]), "checks": len(r["checks"]),
                           "arrays": r["n_compared"]} for c, r in _COMPONENTS.items()},
        "checks": {n: dict(r, max_abs_diff=_finite(r["max_abs_diff"])) for n, r in _CHECKS.items()},
    }


@pytest.fixture(scope="session", autouse=True)
def _parity_session(request):
    """Registers the summary table; at the end writes the JSON report to $PARITY_REPORT if set."""
    plugin = _ParityTable()
    request.config.pluginmanager.register(plugin, "parity-torch-table")
    t0 = time.perf_counter()
    yield
    path = os.environ.get("PARITY_REPORT")
    if path:
        safe_io.write_json(path, _report_json(time.perf_counter() - t0))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The tensors here are tiny: one intra-op thread is ~10x faster than a (contended) pool.
    Restored after this module, so other test files in the same session see torch's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _name_check(request):
    """Names the current check for ``check``; its max abs diff also goes to the test report
    (user_properties, e.g. --junitxml)."""
    _CURRENT["check"] = request.node.name
    yield
    rec = _CHECKS.get(request.node.name)
    if rec is not None:
        request.node.user_properties.append(("max_abs_diff", rec["max_abs_diff"]))


def check(component, what, ours, theirs, tol=TOL):
    """Assert max |ours - theirs| <= tol and record it under ``component`` and the current test."""
    a = ours.detach() if isinstance(ours, torch.Tensor) else torch.tensor(ours, dtype=DT)
    b = theirs.detach() if isinstance(theirs, torch.Tensor) else torch.tensor(theirs, dtype=DT)
    assert a.shape == b.shape, f"{component}: {what}: shape {tuple(a.shape)}, torch {tuple(b.shape)}"
    diff = float((a.to(DT) - b.to(DT)).abs().max()) if a.numel() else 0.0
    if math.isnan(diff):
        diff = math.inf                      # NaN on either side is a failure, and JSON-safe
    name = _CURRENT["check"]
    comp = _COMPONENTS.setdefault(component, {"max_abs_diff": 0.0, "checks": set(), "n_compared": 0})
    comp["max_abs_diff"] = max(comp["max_abs_diff"], diff)
    comp["checks"].add(name)
    comp["n_compared"] += 1
    rec = _CHECKS.setdefault(name, {"component": component, "max_abs_diff": 0.0, "n_compared": 0,
                                    "worst": None})
    rec["n_compared"] += 1
    if diff >= rec["max_abs_diff"]:
        rec["max_abs_diff"], rec["worst"] = diff, what
    assert diff <= tol, f"{component}: {what}: max abs diff {diff:.3e} > {tol:.0e}"
    return diff


# ----------------------------------------------------------------------------- helpers


def seed_of(*values):
    """A stable seed per parametrized case."""
    return zlib.crc32(repr(values).encode())


def rmat(rng, n, m, s=1.0):
    return [[rng.gauss(0.0, s) for _ in range(m)] for _ in range(n)]


def perturb(module, rng, s=0.3):
    """Move every parameter off its init (LayerNorm gamma = 1, beta = 0 and zero biases would hide
    a bias added in the wrong place or a gamma/beta swap)."""
    for p in module.params():
        for r in p.rows("data"):
            r[:] = [x + rng.gauss(0.0, s) for x in r]


def torch_params(module):
    """name -> float64 leaf tensor holding a copy of that Param's data."""
    return {p.name: leaf(p.data) for p in module.params()}


def check_param_grads(component, module, P):
    """Every Param.grad of ours against the autograd gradient of the matching torch leaf."""
    for p in module.params():
        g = P[p.name].grad
        if g is None:                        # the torch graph never used it: its gradient is zero
            g = torch.zeros_like(P[p.name])
        check(component, f"d {p.name}", p.grad, g)


# ============================================================================= layers


@pytest.mark.parametrize("T,d_in,d_out,bias", [(1, 3, 2, True), (5, 4, 7, True), (6, 8, 3, False)])
def t_linear_parity(T, d_in, d_out, bias):
    """eq. (2.15): Linear's Y, dX and dW = X^T dY, db against F.linear and autograd, with and without bias."""
    rng = random.Random(seed_of("linear", T, d_in, d_out, bias))
    lin = core.Linear(d_in, d_out, bias=bias, rng=rng, name="lin")
    perturb(lin, rng)
    X, dY = rmat(rng, T, d_in), rmat(rng, T, d_out)
    Y = lin.forward(X)
    lin.zero_grad()
    dX = lin.backward(dY)
    P, Xt = torch_params(lin), leaf(X)
    Yt = ref_linear(P, "lin", Xt)
    Yt.backward(const(dY))
    check("Linear", "Y", Y, Yt)
    check("Linear", "dX", dX, Xt.grad)
    check_param_grads("Linear", lin, P)


@pytest.mark.parametrize("n,d,ids", [(7, 3, [0, 3, 3, 6, 1, 3]), (5, 2, [4]), (11, 6, [10, 0, 10, 10, 2, 5, 0])])
def t_embedding_parity(n, d, ids):
    """The input path of eq. (8.5): the lookup and its scatter-add gradient (repeated ids) against
    F.embedding."""
    rng = random.Random(seed_of("emb", n, d, ids))
    emb = core.Embedding(n, d, rng=rng, name="emb")
    X = emb.forward(ids)
    dY = rmat(rng, len(ids), d)
    emb.zero_grad()
    emb.backward(dY)                                    # repeated ids: scatter-add
    P = torch_params(emb)
    Xt = F.embedding(torch.tensor(ids), P["emb.W"])
    Xt.backward(const(dY))
    check("Embedding", "X", X, Xt)
    check_param_grads("Embedding", emb, P)


@pytest.mark.parametrize("T,d,offset,scale", [(1, 2, 0.0, 1.0), (5, 8, 3.0, 0.5), (7, 13, -50.0, 4.0),
                                              (3, 16, 0.0, 1e-2)])
def t_layer_norm_parity(T, d, offset, scale):
    """eqs. (5.7)/(5.11): LayerNorm's Y, dX, dgamma, dbeta against F.layer_norm, off-centre and tiny-scale
    inputs included."""
    rng = random.Random(seed_of("ln", T, d, offset, scale))
    ln = core.LayerNorm(d, name="ln")
    perturb(ln, rng)
    X = [[offset + scale * rng.gauss(0, 1) for _ in range(d)] for _ in range(T)]
    dY = rmat(rng, T, d)
    Y = ln.forward(X)
    ln.zero_grad()
    dX = ln.backward(dY)
    P, Xt = torch_params(ln), leaf(X)
    Yt = ref_layer_norm(P, "ln", Xt)                      # F.layer_norm: biased variance, eps 1e-5
    Yt.backward(const(dY))
    check("LayerNorm", "Y", Y, Yt)
    check("LayerNorm", "dX", dX, Xt.grad)
    check_param_grads("LayerNorm", ln, P)


def t_gelu_parity():
    """eq. (5.2): gelu / gelu_grad elementwise against F.gelu(approximate='tanh') and its autograd."""
    xs = [i / 16.0 for i in range(-160, 161)] + [-30.0, -12.5, 12.5, 30.0, 1e-9, -1e-9]
    y = [core.gelu(x) for x in xs]
    g = [core.gelu_grad(x) for x in xs]
    xt = leaf(xs)
    yt = F.gelu(xt, approximate="tanh")
    yt.backward(torch.ones_like(yt))
    check("GELU (tanh)", "y", y, yt)
    check("GELU (tanh)", "dy/dx", g, xt.grad)


@pytest.mark.parametrize("T,d,d_ff", [(1, 2, 4), (6, 8, 16), (40, 4, 6)])
def t_feed_forward_parity(T, d, d_ff):
    """eqs. (5.1)/(5.2): FeedForward's Y, dX and every parameter gradient against the torch twin."""
    rng = random.Random(seed_of("ffn", T, d, d_ff))
    ffn = core.FeedForward(d, d_ff, rng=rng, name="ffn")
    perturb(ffn, rng)
    X, dY = rmat(rng, T, d), rmat(rng, T, d)
    Y = ffn.forward(X)
    ffn.zero_grad()
    dX = ffn.backward(dY)
    P, Xt = torch_params(ffn), leaf(X)
    Yt = ref_ffn(P, "ffn", Xt)
    Yt.backward(const(dY))
    check("FeedForward", "Y", Y, Yt)
    check("FeedForward", "dX", dX, Xt.grad)
    check_param_grads("FeedForward", ffn, P)


def t_softmax_parity():
    """eqs. (2.3)/(2.5): softmax_rows / softmax_backward against torch.softmax and autograd (finite rows)."""
    rng = random.Random(seed_of("softmax"))
    S = rmat(rng, 6, 9, 3.0) + [[700.0, 699.0, -700.0] + [0.0] * 6]       # huge logits: max-subtraction
    dA = rmat(rng, len(S), 9)
    A = core.softmax_rows(S)
    dS = core.softmax_backward(A, dA)
    St = leaf(S)
    At = torch.softmax(St, dim=-1)
    At.backward(const(dA))
    check("softmax", "A", A, At)
    check("softmax", "dS", dS, St.grad)


@pytest.mark.parametrize("T,d_h", [(1, 2), (9, 8), (40, 4)])
def t_rope_parity(T, d_h):
    """eq. (4.7): rope_rows (forward and inverse = backward) and rope_rotate against the rotation in torch."""
    rng = random.Random(seed_of("rope", T, d_h))
    X, dY = rmat(rng, T, d_h), rmat(rng, T, d_h)
    Xt = leaf(X)
    Yt = ref_rope(Xt)
    Yt.backward(const(dY))
    check("RoPE (rope_rows)", "forward", core.rope_rows(X), Yt)
    check("RoPE (rope_rows)", "backward = inverse rotation", core.rope_rows(dY, inverse=True), Xt.grad)
    check("RoPE (rope_rows)", "rope_rotate per row", [core.rope_rotate(x, t) for t, x in enumerate(X)], Yt)
    check("RoPE (rope_rows)", "rope_rotate_inverse per row",
          [core.rope_rotate_inverse(g, t) for t, g in enumerate(dY)], Xt.grad)


@pytest.mark.parametrize("T,d", [(1, 2), (70, 16), (5, 7)])
def t_sine_table_parity(T, d):
    """eq. (4.4): sine_cosine_table against the table built in torch, odd d and more than 64 rows included."""
    check("sine/cosine table", f"T={T} d={d}", core.sine_cosine_table(T, d), ref_sine_table(T, d))


# ============================================================================= attention

# (kind, T, d, H, causal, rope, padded key positions)
MHA_SELF_CASES = [
    ("unmasked", 5, 8, 2, False, False, None),
    ("unmasked", 1, 4, 2, False, False, None),                  # T = 1, d_h = 2
    ("causal", 6, 8, 4, True, False, None),                     # d_h = 2
    ("causal", 40, 12, 3, True, False, None),                   # long sequence
    ("key padding", 7, 6, 3, False, False, (2, 5, 6)),
    ("key padding", 4, 8, 1, True, False, (3,)),                # causal + padding
    ("RoPE", 6, 8, 2, False, True, None),
    ("RoPE", 40, 8, 4, True, True, None),                       # causal RoPE, d_h = 2, long
    ("RoPE", 5, 12, 3, False, True, (0, 4)),                    # RoPE + padding
    ("fully masked rows", 5, 8, 2, True, False, (0, 1)),        # queries 0, 1 see no key
]


@pytest.mark.parametrize("kind,T,d,H,causal,rope,pad", MHA_SELF_CASES)
def t_mha_self_parity(kind, T, d, H, causal, rope, pad):
    """eqs. (2.11)-(2.16) for self-attention, unmasked, causal (eq. 6.1), padded and with RoPE (eq. 4.7): Y,
    dX and every parameter gradient against SDPA and the explicit formula."""
    rng = random.Random(seed_of("mha", kind, T, d, H, causal, rope, pad))
    mha = core.MultiHeadAttention(d, H, rng=rng, causal=causal, rope=rope, name="attn")
    perturb(mha, rng)
    X, dY = rmat(rng, T, d), rmat(rng, T, d)
    kpm = [t in pad for t in range(T)] if pad else None
    Y = mha.forward(X, key_padding_mask=kpm)
    mha.zero_grad()
    dX = mha.backward(dY)
    comp = f"MultiHeadAttention self, {kind}"
    # SDPA and explicit ops both; for rows with no visible key only the explicit version, which
    # implements the library's documented convention (zero output, zero gradient) instead of NaN.
    for impl in (("explicit",) if kind == "fully masked rows" else ("sdpa", "explicit")):
        P, Xt = torch_params(mha), leaf(X)
        Yt = ref_attention(P, "attn", Xt, H=H, causal=causal, rope=rope, kpm=kpm, impl=impl)
        Yt.backward(const(dY))
        check(comp, f"Y [{impl}]", Y, Yt)
        check(comp, f"dX [{impl}]", dX, Xt.grad)
        check_param_grads(comp, mha, P)
    if kind == "fully masked rows":
        assert all(v == 0.0 for t in (0, 1) for v in mha.o.X[t]), "fully masked query must give zero"


# (T target, S source, d, H, padded memory positions)
MHA_CROSS_CASES = [
    (3, 5, 8, 2, None),
    (1, 7, 4, 2, (1, 6)),                                       # T = 1, d_h = 2, padding
    (9, 2, 6, 3, None),                                         # T > S
    (40, 11, 8, 4, (0, 10)),                                    # long target, d_h = 2
]


@pytest.mark.parametrize("T,S,d,H,pad", MHA_CROSS_CASES)
def t_mha_cross_parity(T, S, d, H, pad):
    """eqs. (2.11)-(2.16) for cross-attention (T != S, padded memory): Y, dX, dmemory and every parameter
    gradient."""
    rng = random.Random(seed_of("cross", T, S, d, H, pad))
    mha = core.MultiHeadAttention(d, H, rng=rng, cross=True, name="xattn")
    perturb(mha, rng)
    X, M, dY = rmat(rng, T, d), rmat(rng, S, d), rmat(rng, T, d)
    kpm = [s in pad for s in range(S)] if pad else None
    Y = mha.forward(X, M, key_padding_mask=kpm)
    mha.zero_grad()
    dX, dM = mha.backward(dY)
    comp = "MultiHeadAttention cross (T != S)"
    for impl in ("sdpa", "explicit"):
        P, Xt, Mt = torch_params(mha), leaf(X), leaf(M)
        Yt = ref_attention(P, "xattn", Xt, memory=Mt, H=H, kpm=kpm, impl=impl)
        Yt.backward(const(dY))
        check(comp, f"Y [{impl}]", Y, Yt)
        check(comp, f"dX [{impl}]", dX, Xt.grad)
        check(comp, f"dmemory [{impl}]", dM, Mt.grad)
        check_param_grads(comp, mha, P)


# ============================================================================= blocks


@pytest.mark.parametrize("T,d,H,d_ff,rope,causal,pad", [
    (5, 8, 2, 16, False, False, None),
    (1, 4, 2, 6, True, False, None),                            # T = 1, d_h = 2
    (7, 6, 3, 12, False, False, (1, 6)),
    (40, 8, 2, 10, True, True, (39,)),                          # long, RoPE, causal, padding
])
def t_encoder_block_parity(T, d, H, d_ff, rope, causal, pad):
    """eq. (5.4): the Pre-LN encoder block's Y, dX and every parameter gradient against the torch twin."""
    rng = random.Random(seed_of("enc_block", T, d, H, d_ff, rope, causal, pad))
    blk = core.EncoderBlock(d, H, d_ff, rng=rng, rope=rope, causal=causal, name="blk")
    perturb(blk, rng)
    X, dY = rmat(rng, T, d), rmat(rng, T, d)
    kpm = [t in pad for t in range(T)] if pad else None
    Y = blk.forward(X, key_padding_mask=kpm)
    blk.zero_grad()
    dX = blk.backward(dY)
    P, Xt = torch_params(blk), leaf(X)
    Yt = ref_encoder_block(P, "blk", Xt, H, rope=rope, causal=causal, kpm=kpm)
    Yt.backward(const(dY))
    check("EncoderBlock (Pre-LN)", "Y", Y, Yt)
    check("EncoderBlock (Pre-LN)", "dX", dX, Xt.grad)
    check_param_grads("EncoderBlock (Pre-LN)", blk, P)


@pytest.mark.parametrize("T,S,d,H,d_ff,rope,cross,pad", [
    (4, 6, 8, 2, 16, False, True, (5,)),
    (1, 3, 4, 2, 6, False, True, None),                         # T = 1, d_h = 2
    (6, 1, 6, 3, 8, True, True, None),                          # RoPE on self-attention only
    (40, 0, 8, 4, 12, True, False, None),                       # LM block (no cross), long
])
def t_decoder_block_parity(T, S, d, H, d_ff, rope, cross, pad):
    """eq. (5.4): the Pre-LN decoder block (with or without cross-attention) against the torch twin: Y, dX,
    dmemory, parameters."""
    rng = random.Random(seed_of("dec_block", T, S, d, H, d_ff, rope, cross, pad))
    blk = core.DecoderBlock(d, H, d_ff, rng=rng, rope=rope, cross=cross, name="blk")
    perturb(blk, rng)
    X, dY = rmat(rng, T, d), rmat(rng, T, d)
    M = rmat(rng, S, d) if cross else None
    kpm = [s in pad for s in range(S)] if pad else None
    Y = blk.forward(X, M, memory_padding_mask=kpm)
    blk.zero_grad()
    dX, dM = blk.backward(dY)
    P, Xt = torch_params(blk), leaf(X)
    Mt = leaf(M) if cross else None
    Yt = ref_decoder_block(P, "blk", Xt, H, memory=Mt, rope=rope, mkpm=kpm)
    Yt.backward(const(dY))
    comp = "DecoderBlock (Pre-LN)"
    check(comp, "Y", Y, Yt)
    check(comp, "dX", dX, Xt.grad)
    if cross:
        check(comp, "dmemory", dM, Mt.grad)
    else:
        assert dM is None
    check_param_grads(comp, blk, P)


# ============================================================================= models


@pytest.mark.parametrize("pos,T,n_out,pad_at,n_feat", [
    ("sine", 6, 1, (4, 5), 0),                                     # trailing padding, mean over 4 rows
    ("learned", 5, 3, None, 0),
    ("rope", 40, 2, (0, 17, 39), 0),                            # long sequence, padding anywhere
    ("none", 1, 1, None, 0),                                    # T = 1
    ("sine", 70, 1, (69,), 0),                                  # beyond the 64-row sine cache
    ("sine", 7, 1, (6,), 4),                                    # + token features (4 per token)
])
def t_transformer_encoder_parity(pos, T, n_out, pad_at, n_feat):
    """eq. (5.4) stacked, then mean pooling over unpadded rows and the head: the output and every parameter
    gradient."""
    rng = random.Random(seed_of("encoder", pos, T, n_out, pad_at))
    V, pad_id = 9, 0
    feats = [[rng.gauss(0, 1) for _ in range(n_feat)] for _ in range(V)] if n_feat else None
    model = core.TransformerEncoder(V, d_model=8, n_heads=2, n_layers=2, d_ff=12, n_out=n_out, pos=pos,
                                  max_len=72, pad_id=pad_id, seed=seed_of(pos, T), token_features=feats)
    perturb(model, rng)
    ids = [pad_id if (pad_at and t in pad_at) else rng.randrange(1, V) for t in range(T)]
    dy = [rng.gauss(0, 1) for _ in range(n_out)]
    y = model.forward(ids)
    model.zero_grad()
    model.backward(dy)
    P = torch_params(model)
    yt = ref_encoder_model(P, model.config, ids)
    yt.backward(const(dy))
    comp = "TransformerEncoder (mean pool + head)"
    check(comp, "y", y, yt)
    check_param_grads(comp, model, P)


@pytest.mark.parametrize("pos,tied,T", [
    ("sine", True, 7),
    ("learned", True, 1),                                       # T = 1
    ("rope", True, 40),                                         # long sequence
    ("none", False, 5),
    ("rope", False, 6),
])
def t_transformer_lm_parity(pos, tied, T):
    """eq. (8.5): the LM's logits and every parameter gradient; with tied weights dE = input scatter-add +
    H^T dlogits, both paths non-negligible."""
    rng = random.Random(seed_of("lm", pos, tied, T))
    V = 11
    model = core.TransformerLM(V, d_model=8, n_heads=4, n_layers=2, d_ff=12, max_len=48, pos=pos,
                             tie_weights=tied, seed=seed_of(pos, tied))
    perturb(model, rng)
    ids = [rng.randrange(V) for _ in range(T)]
    dlogits = rmat(rng, T, V)
    logits = model.forward(ids)
    model.zero_grad()
    model.backward(dlogits)
    P = torch_params(model)
    Lt = ref_lm(P, model.config, ids)
    Lt.backward(const(dlogits))
    comp = "TransformerLM (tied)" if tied else "TransformerLM (untied head)"
    check(comp, "logits", logits, Lt)
    check_param_grads(comp, model, P)
    if tied:
        # the tied embedding's gradient is the sum of the input (scatter-add) path and the output
        # (H^T dlogits) path; both are non-negligible here, so dropping either would fail above.
        E = P["embed.tok.W"].detach()
        E_in, E_out = E.clone().requires_grad_(True), E.clone().requires_grad_(True)
        P2 = dict(P, **{"embed.tok.W": E_in})
        ref_lm(P2, model.config, ids, head_E=E_out).backward(const(dlogits))
        check(comp, "dE = input path + output path", model.embed.tok.W.grad, E_in.grad + E_out.grad)
        ours = const(model.embed.tok.W.grad)
        assert float((ours - E_out.grad).abs().max()) > 1e-3, "input path contributes nothing?"
        assert float((ours - E_in.grad).abs().max()) > 1e-3, "output path contributes nothing?"


@pytest.mark.parametrize("pos,S,T,src_pad", [
    ("sine", 6, 4, (5,)),
    ("learned", 1, 1, None),                                    # S = T = 1
    ("rope", 40, 9, (0, 38, 39)),                               # long source, RoPE, padding
    ("none", 3, 12, None),                                      # T > S
])
def t_encoder_decoder_parity(pos, S, T, src_pad):
    """eqs. (2.11)-(2.16) and (5.4) end to end: an EncoderDecoder's logits and every parameter gradient,
    padded source included."""
    rng = random.Random(seed_of("s2s", pos, S, T, src_pad))
    Vs, Vt, pad_id = 8, 10, 0
    model = core.EncoderDecoder(Vs, Vt, d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=48, pos=pos,
                              src_pad_id=pad_id, seed=seed_of(pos, S))
    perturb(model, rng)
    src = [pad_id if (src_pad and s in src_pad) else rng.randrange(1, Vs) for s in range(S)]
    tgt = [rng.randrange(Vt) for _ in range(T)]
    dlogits = rmat(rng, T, Vt)
    logits = model.forward(src, tgt)
    model.zero_grad()
    model.backward(dlogits)
    P = torch_params(model)
    Lt = ref_seq2seq(P, model.config, src, tgt)
    Lt.backward(const(dlogits))
    comp = "EncoderDecoder"
    check(comp, "logits", logits, Lt)
    check_param_grads(comp, model, P)


# ============================================================================= dropout


def our_masks(model):
    """The dropout masks our last training forward drew, name -> tensor, named as the ref_* functions read
    them: embeddings '<embed>.drop', attention '<attn>.drop' (H, T, S), FFN '<ffn>.drop', each block's
    residual branches '<block>.drop0', '.drop1', ('.drop2')."""
    D = {}

    def add(key, M):
        if M is not None:
            D[key] = const(M)
    for e in (getattr(model, n, None) for n in ("embed", "src_embed", "tgt_embed")):
        if e is not None:
            add(e.name + ".drop", e.drop.mask)
    for b in getattr(model, "blocks", []) + getattr(model, "enc_blocks", []) + getattr(model, "dec_blocks", []):
        branches = (b.drop1, b.drop2) if hasattr(b, "attn") else (b.drop1, getattr(b, "drop2", None), b.drop3)
        for i, drop in enumerate(branches):                         # each residual branch's Dropout layer
            if drop is not None:
                add(f"{b.name}.drop{i}", drop.mask)
        for attn in (getattr(b, n, None) for n in ("attn", "self_attn", "cross_attn")):
            if attn is not None and attn.drop_heads[0].mask is not None:
                add(attn.name + ".drop", [d.mask for d in attn.drop_heads])   # (H, T, S), one Dropout per head
        add(b.ffn.name + ".drop", b.ffn.drop.mask)
    return D


@pytest.mark.parametrize("kind,pos", [("lm", "rope"), ("lm", "learned"), ("encoder", "sine"),
                                      ("seq2seq", "rope"), ("seq2seq", "none")])
def t_dropout_parity_with_the_same_masks(kind, pos):
    """Section 5.6: a training forward with dropout (p = 0.2, masks from a fixed rng) and its backward equal
    torch autograd of the same model with the SAME masks applied where the docstrings place them: after
    the embedding sum, after the attention softmax, on each residual branch, in the FFN hidden layer."""
    rng = random.Random(seed_of("dropout", kind, pos))
    kw = dict(d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=16, pos=pos, seed=seed_of(kind, pos), dropout=0.2)
    if kind == "lm":
        model, args = core.TransformerLM(9, tie_weights=True, **kw), ([rng.randrange(9) for _ in range(7)],)
    elif kind == "encoder":
        model, args = core.TransformerEncoder(9, n_out=2, pad_id=0, **kw), ([3, 1, 4, 1, 5, 0],)
    else:
        model, args = core.EncoderDecoder(9, 7, src_pad_id=0, **kw), ([2, 5, 3, 6, 0], [1, 4, 2, 3, 6, 5])
    perturb(model, rng)
    model.dropout_rng = random.Random(3)
    out = model.forward(*args)
    model.dropout_rng = None
    grad = rmat(rng, len(out), len(out[0])) if isinstance(out[0], list) else [rng.gauss(0, 1) for _ in out]
    model.zero_grad()
    model.backward(grad)
    D = our_masks(model)
    n_attn = sum(key.endswith("attn.drop") for key in D)
    assert n_attn == {"lm": 2, "encoder": 2, "seq2seq": 6}[kind]            # every attention layer dropped
    assert any(bool((m == 0).any()) for m in D.values()), "nothing was dropped"
    P = torch_params(model)
    ref = {"lm": ref_lm, "encoder": ref_encoder_model, "seq2seq": ref_seq2seq}[kind]
    yt = ref(P, model.config, *args, D=D)
    yt.backward(const(grad))
    comp = f"dropout ({type(model).__name__})"
    check(comp, "output", out, yt)
    check_param_grads(comp, model, P)
    plain = ref(torch_params(model), model.config, *args)                  # without the masks: different
    assert float((plain.detach() - const(out)).abs().max()) > 1e-3


# ============================================================================= losses


@pytest.mark.parametrize("N,V,ignore_index,n_ignored,smoothing", [
    (5, 7, None, 0, 0.0),
    (6, 4, -100, 2, 0.0),
    (7, 9, -100, 3, 0.1),
    (1, 3, None, 0, 0.3),                                       # one row
    (8, 5, 2, None, 0.2),                                       # ignore a real class id
])
def t_cross_entropy_parity(N, V, ignore_index, n_ignored, smoothing):
    """eq. (6.4), the library's convention = PyTorch's: q = (1 - eps) onehot + eps / V over ALL V classes, mean over
    the rows whose target is not ignore_index (ignored rows get zero gradient)."""
    rng = random.Random(seed_of("ce", N, V, ignore_index, n_ignored, smoothing))
    logits = rmat(rng, N, V, 2.0)
    targets = [rng.randrange(V) for _ in range(N)]
    if n_ignored:
        for i in rng.sample(range(N), n_ignored):
            targets[i] = ignore_index
    if ignore_index is not None and ignore_index >= 0:
        targets[0] = ignore_index                                # make sure at least one row is ignored
        targets[-1] = (ignore_index + 1) % V                     # ... and at least one is not
    loss, dlogits = core.cross_entropy_rows(logits, targets, ignore_index=ignore_index,
                                          label_smoothing=smoothing)
    Zt = leaf(logits)
    Lt = F.cross_entropy(Zt, torch.tensor(targets), label_smoothing=smoothing,
                         ignore_index=-100 if ignore_index is None else ignore_index)
    Lt.backward()
    comp = "cross_entropy_rows (ignore_index, smoothing)"
    check(comp, "loss", loss, Lt)
    check(comp, "dlogits", dlogits, Zt.grad)


def t_cross_entropy_all_ignored_convention():
    """eq. (6.4) when every row is ignored, a convention difference stated and tested on our side only: the
    library returns loss 0 and zero gradient (a batch with nothing to learn contributes nothing),
    whereas F.cross_entropy's mean divides 0 by 0.  torch's reduction='sum' agrees with ours."""
    logits, targets = [[0.3, -1.0, 2.0], [1.0, 0.0, 0.5]], [-100, -100]
    loss, dlogits = core.cross_entropy_rows(logits, targets, ignore_index=-100, label_smoothing=0.1)
    Zt = leaf(logits)
    Lt = F.cross_entropy(Zt, torch.tensor(targets), ignore_index=-100, label_smoothing=0.1, reduction="sum")
    Lt.backward()
    check("cross_entropy_rows (all rows ignored)", "loss (torch: reduction='sum')", loss, Lt)
    check("cross_entropy_rows (all rows ignored)", "dlogits (torch: reduction='sum')", dlogits, Zt.grad)


def t_mse_parity():
    """mse_loss (the regression loss; no tutorial equation number) and its gradient against F.mse_loss."""
    rng = random.Random(seed_of("mse"))
    pred, target = [rng.gauss(0, 1) for _ in range(5)], [rng.gauss(0, 1) for _ in range(5)]
    loss, dpred = core.mse_loss(pred, target)
    pt = leaf(pred)
    Lt = F.mse_loss(pt, const(target))
    Lt.backward()
    check("mse_loss", "loss", loss, Lt)
    check("mse_loss", "dpred", dpred, pt.grad)


def t_task_losses_parity():
    """eq. (6.4) and the MSE through whole models: lm_loss / seq2seq_loss / regression_loss end to end
    (model + loss + backward) against torch."""
    rng = random.Random(seed_of("task losses"))
    comp = "task losses (lm / seq2seq / regression)"
    # lm_loss: pair form with ignored targets and label smoothing
    lm = core.TransformerLM(7, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=16, pos="rope",
                          tie_weights=True, seed=3)
    perturb(lm, rng)
    inp, tgt = [1, 4, 2, 6, 0, 3], [4, 2, -100, 0, 3, -100]
    lm.zero_grad()
    loss = core.lm_loss(lm, (inp, tgt), label_smoothing=0.1)
    P = torch_params(lm)
    Lt = F.cross_entropy(ref_lm(P, lm.config, inp), torch.tensor(tgt), ignore_index=-100, label_smoothing=0.1)
    Lt.backward()
    check(comp, "lm_loss", loss, Lt)
    check_param_grads(comp, lm, P)
    # seq2seq_loss: teacher forcing, tgt = [bos ... eos], inputs tgt[:-1], targets tgt[1:]
    s2s = core.EncoderDecoder(6, 7, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=16, pos="learned",
                            src_pad_id=0, seed=4)
    perturb(s2s, rng)
    src, tgt = [3, 5, 1, 0, 0], [1, 6, 2, 4, 2]
    s2s.zero_grad()
    loss = core.seq2seq_loss(s2s, (src, tgt))
    P = torch_params(s2s)
    Lt = F.cross_entropy(ref_seq2seq(P, s2s.config, src, tgt[:-1]), torch.tensor(tgt[1:]))
    Lt.backward()
    check(comp, "seq2seq_loss", loss, Lt)
    check_param_grads(comp, s2s, P)
    # regression_loss: MSE over n_out outputs
    enc = core.TransformerEncoder(6, d_model=8, n_heads=2, n_layers=1, d_ff=8, n_out=2, pos="sine",
                                pad_id=0, seed=5)
    perturb(enc, rng)
    ids, y = [2, 5, 3, 0], [0.7, -1.2]
    enc.zero_grad()
    loss = core.regression_loss(enc, (ids, y))
    P = torch_params(enc)
    Lt = F.mse_loss(ref_encoder_model(P, enc.config, ids), const(y))
    Lt.backward()
    check(comp, "regression_loss", loss, Lt)
    check_param_grads(comp, enc, P)


# ============================================================================= scoring (generation)


@pytest.mark.parametrize("scale", [1.0, 1e3])
def t_log_softmax_parity(scale):
    """The log of eq. (2.3), max-subtracted: log_softmax against F.log_softmax, for logits of size 1 and 1e3;
    -inf stays -inf."""
    rng = random.Random(seed_of("log_softmax", scale))
    row = [rng.gauss(0, scale) for _ in range(9)] + [-math.inf]    # a masked entry stays -inf
    ours, theirs = core.log_softmax(row), F.log_softmax(const(row), dim=-1)
    assert ours[-1] == -math.inf and float(theirs[-1]) == -math.inf
    check("log_softmax (one row)", "values", ours[:-1], theirs[:-1])


@pytest.mark.parametrize("kind,pos", [("lm", "rope"), ("lm", "learned"), ("s2s", "sine"), ("s2s", "rope")])
def t_sequence_logprob_parity(kind, pos):
    """Minus the summed cross-entropy of eq. (6.4): sum_t log p(ids[t] | ids[:t]) through the K/V-cached
    pass, against torch's log_softmax of the reference model's logits (written in this file,
    independently of our code)."""
    rng = random.Random(seed_of("seqlogprob", kind, pos))
    V = 9
    ids = [rng.randrange(V) for _ in range(12)]
    if kind == "lm":
        model = core.TransformerLM(V, d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=16, pos=pos,
                                 tie_weights=True, seed=seed_of(kind, pos))
        perturb(model, rng)
        logits, src = ref_lm(torch_params(model), model.config, ids[:-1]), None
    else:
        model = core.EncoderDecoder(7, V, d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=16, pos=pos,
                                  src_pad_id=0, seed=seed_of(kind, pos))
        perturb(model, rng)
        src = [rng.randrange(1, 7) for _ in range(5)] + [0, 0]
        logits = ref_seq2seq(torch_params(model), model.config, src, ids[:-1])
    lp_t = F.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum()
    check("sequence_logprob (K/V-cached pass)", "log p", core.sequence_logprob(model, ids, src=src), lp_t)


# ============================================================================= optimisation


def _noam_lambda(d_model, warmup):
    """The noam schedule written here (not core.noam_lr): d^-0.5 min(s^-0.5, s warmup^-1.5), 0 at 0."""
    return lambda s: 0.0 if s <= 0 else d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def _opt_model_and_data():
    model = core.TransformerLM(6, d_model=8, n_heads=2, n_layers=1, d_ff=12, max_len=16, pos="learned",
                             tie_weights=True, seed=11)
    perturb(model, random.Random(12), s=0.1)
    rng = random.Random(13)
    data = [[rng.randrange(6) for _ in range(rng.randrange(3, 8))] for _ in range(3)]
    return model, data


@pytest.mark.parametrize("variant", ["Adam", "AdamW (decoupled wd)", "AdamW + clip + noam"])
def t_adam_parity(variant):
    """eqs. (7.7)/(7.8): 20 steps of our Adam vs torch.optim on the same model and data; every parameter
    compared after every step.  weight_decay > 0 is decoupled (w *= 1 - lr wd first), i.e. torch's AdamW,
    not torch.optim.Adam(weight_decay=...), which adds wd * w to the gradient."""
    model, data = _opt_model_and_data()
    params = model.params()
    P = torch_params(model)
    tparams = [P[p.name] for p in params]
    lr, betas, eps = 1e-2, (0.9, 0.98), 1e-8
    wd = 0.0 if variant == "Adam" else 0.1
    sched = clip = None
    if variant == "Adam":
        opt_t = torch.optim.Adam(tparams, lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    else:
        opt_t = torch.optim.AdamW(tparams, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    if "noam" in variant:
        clip, warmup = 0.5, 5
        noam = _noam_lambda(8, warmup)
        for g in opt_t.param_groups:
            g["lr"] = 1.0
            g["initial_lr"] = 1.0
        # torch convention: the k-th optimizer.step() (k = 1, 2, ...) runs at lambda(k - 1); ours at
        # noam_lr(k) (step counted from 1).  Shift the lambda by one so both use the same lr.
        sched = torch.optim.lr_scheduler.LambdaLR(opt_t, lambda s: noam(s + 1))
    opt = core.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    start = torch.cat([const(p.data).flatten() for p in params])
    comp = f"optimiser: {variant}"
    for step in range(1, 21):
        model.zero_grad()
        opt_t.zero_grad()
        for ids in data:
            core.lm_loss(model, ids)
            loss_t = F.cross_entropy(ref_lm(P, model.config, ids[:-1]), torch.tensor(ids[1:]))
            loss_t.backward()
        check(comp, f"step {step}: grads before the step",
              torch.cat([const(p.grad).flatten() for p in params]),
              torch.cat([t.grad.flatten() for t in tparams]))
        # Feed both optimisers the SAME gradients (ours): a few gradients are exactly zero in exact
        # arithmetic (e.g. the K-projection bias: softmax is shift-invariant) and are rounding noise
        # ~1e-17 on either side; Adam divides by sqrt(v), turning such noise into steps of +-lr.
        with torch.no_grad():
            for p, t in zip(params, tparams):
                t.grad.copy_(const(p.grad))
        if clip:
            norm, _ = core.clip_grad_norm(params, clip)
            norm_t = torch.nn.utils.clip_grad_norm_(tparams, clip)
            check(comp, f"step {step}: grad norm", [norm], norm_t.reshape(1))
        if sched is not None:
            opt.step(core.noam_lr(step, 8, warmup))
            check(comp, f"step {step}: lr", [core.noam_lr(step, 8, warmup)], [opt_t.param_groups[0]["lr"]])
            opt_t.step()
            sched.step()
        else:
            opt.step()
            opt_t.step()
        for p, t in zip(params, tparams):
            check(comp, f"step {step}: {p.name}", p.data, t)
    moved = float((torch.cat([const(p.data).flatten() for p in params]) - start).abs().max())
    assert moved > 1e-2, f"the parameters hardly moved in 20 steps ({moved:.2e}): the test would be vacuous"


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def t_clip_grad_norm_parity(max_norm):
    """eq. (8.3): clip_grad_norm vs torch.nn.utils.clip_grad_norm_: returned norm and clipped gradients."""
    rng = random.Random(seed_of("clip", max_norm))
    ffn = core.FeedForward(4, 6, rng=rng, name="ffn")
    for p in ffn.params():
        for r in p.rows("grad"):
            r[:] = [rng.gauss(0, 1) for _ in r]
    P = torch_params(ffn)
    for p in ffn.params():
        P[p.name].grad = const(p.grad)
    norm, _ = core.clip_grad_norm(ffn.params(), max_norm)
    norm_t = torch.nn.utils.clip_grad_norm_([P[p.name] for p in ffn.params()], max_norm)
    comp = "clip_grad_norm"
    check(comp, "norm", [norm], norm_t.reshape(1))
    for p in ffn.params():
        check(comp, f"clipped {p.name}", p.grad, P[p.name].grad)


@pytest.mark.parametrize("schedule", ["noam", "warmup_inv_sqrt"])
def t_schedule_parity(schedule):
    """eq. (8.1): our schedule at step s vs LambdaLR's lr after s scheduler steps, s = 0..300."""
    d_model, warmup, peak = 48, 40, 2e-3
    w = torch.zeros(1, dtype=DT, requires_grad=True)
    if schedule == "noam":
        base, lam, ours = 1.0, _noam_lambda(d_model, warmup), (lambda s: core.noam_lr(s, d_model, warmup))
    else:
        base = peak
        def lam(s):
            return (0.0 if s <= 0 else min(s / warmup, math.sqrt(warmup / s)))
        def ours(s):
            return (core.warmup_inv_sqrt_lr(s, peak, warmup))
    opt = torch.optim.SGD([w], lr=base)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    mine, theirs = [], []
    for s in range(301):
        mine.append(ours(s))
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()                                               # no grad: a no-op, keeps the order
        sched.step()
    check(f"schedule: {schedule} vs LambdaLR", "lr over 301 steps", mine, theirs)
