"""Tests for transformer.py: every backward against central finite differences, plus the properties the
tutorial derives (masking, positions, optimiser, persistence).  Each test of a formula names the
tutorial's equation in its docstring's first words, e.g. "eq. (5.11): ...".  The BPE tests are in tests/tests_bpe.py.

Run either way:
    python tests_transformer.py        # zero third-party imports; one line per test
    python -m pytest                   # pytest collects the t_* functions (see pyproject.toml)

Gradient checks use central differences with eps = 1e-4 and pass an entry when the relative
error is < 1e-5 or the absolute error is < 1e-8 (``transformer.grad_ok``), for EVERY entry of
every parameter of the module under test.  Models are tiny so the whole file runs in seconds.
"""
import json
import math
import os
import random
import re
import sys
import tempfile
import time
import traceback
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformer as core

# ----------------------------------------------------------------------------- helpers


def _raises(exc_type, fn):
    """Call fn() and return the exception of type exc_type it raises; fail if it raises none."""
    try:
        fn()
    except exc_type as e:
        return e
    raise AssertionError(f"expected {exc_type.__name__}, nothing was raised")


def _rmat(rng, n, m, s=1.0):
    return [[rng.gauss(0.0, s) for _ in range(m)] for _ in range(n)]


def _proj(Y, R):
    """Scalar loss L = sum(Y * R): its gradient with respect to Y is R."""
    return sum(core.dot(y, r) for y, r in zip(Y, R))


def _check(loss_fn, params, label, eps=1e-4):
    """Per-parameter finite-difference check of every entry; fails with the worst parameter named."""
    rep = core.gradient_check(loss_fn, params, eps=eps)
    bad = {k: v for k, v in rep["per_param"].items() if v["n_failed"]}
    assert rep["ok"], f"{label}: gradient check failed for {bad}"
    assert rep["n_params"] == sum(p.size() for p in params)
    return rep


def _module_check(module, X, rng, *extra, label=""):
    """Check a (T, d) -> (T, d') module with the random-projection loss, params and input."""
    R = _rmat(rng, len(X), len(module.forward(X, *extra)[0]))

    def loss(backward):
        L = _proj(module.forward(X, *extra), R)
        if backward:
            module.backward(R)
        return L
    _check(loss, module.params(), label or type(module).__name__)
    # the input gradient too: dL/dX from backward against central differences
    module.forward(X, *extra)
    dX = module.backward(R)
    dX = dX[0] if isinstance(dX, tuple) else dX
    num = core.numerical_grad(lambda: loss(False), X)
    for a_row, n_row in zip(dX, num):
        for a, n in zip(a_row, n_row):
            assert core.grad_ok(a, n), f"{label}: input gradient {a} vs numeric {n}"


# ----------------------------------------------------------------------------- ops


def t_matmul_variants_agree_with_naive():
    """matmul, matmul_nt (A B^T) and matmul_tn (A^T B, the X^T dY of eq. (2.15)) agree with the textbook
    triple loop."""
    rng = random.Random(0)
    A, B, C = _rmat(rng, 3, 4), _rmat(rng, 4, 5), _rmat(rng, 5, 4)
    naive = [[sum(A[i][k] * B[k][j] for k in range(4)) for j in range(5)] for i in range(3)]
    for got in (core.matmul(A, B), core.matmul_nt(A, core.transpose(B)), core.matmul_tn(core.transpose(A), B)):
        assert all(abs(x - y) < 1e-12 for r, s in zip(got, naive) for x, y in zip(r, s))
    assert core.matmul_nt(A, C)[1][2] == core.dot(A[1], C[2])
    assert core.scale_mat([[1.0, -2.0]], 3.0) == [[3.0, -6.0]]
    assert core.add_mat([[1.0, 2.0]], [[0.5, 0.5]]) == [[1.5, 2.5]]


def t_dot_implementation_chosen_once_for_this_interpreter():
    expected = "math.sumprod" if sys.version_info >= (3, 12) else "sum(map(mul))"
    assert core.DOT_IMPL == expected
    assert core.dot([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == 32.0


def t_shape_errors_name_module_and_shapes():
    lin = core.Linear(4, 3, name="proj")
    e = _raises(core.ShapeError, lambda: lin.forward([[1.0, 2.0, 3.0]]))
    assert "Linear 'proj'" in str(e) and "(1, 3)" in str(e) and "(1, 4)" in str(e)
    e = _raises(core.ShapeError, lambda: core.matmul([[1.0, 2.0]], [[1.0, 2.0]]))
    assert "(1, 2)" in str(e)
    ln = core.LayerNorm(5, name="ln1")
    e = _raises(core.ShapeError, lambda: ln.forward([[1.0] * 5, [1.0] * 4]))
    assert "LayerNorm 'ln1'" in str(e) and "(2, 4)" in str(e)
    emb = core.Embedding(5, 2, name="tok")
    e = _raises(ValueError, lambda: emb.forward([1, 7]))
    assert "7" in str(e) and "tok" in str(e)


def t_softmax_rows_stable_with_logits_scaled_by_1e3():
    """eq. (2.3): the max-subtracted softmax stays finite and sums to 1 for logits of size 1e3, and is
    shift-invariant."""
    rng = random.Random(1)
    S = [[1e3 * rng.gauss(0, 1) for _ in range(7)] for _ in range(4)]
    A = core.softmax_rows(S)
    for row in A:
        assert abs(sum(row) - 1.0) < 1e-12 and all(math.isfinite(a) for a in row)
    # shift invariance
    B = core.softmax_rows([[x + 123.0 for x in r] for r in S])
    assert all(abs(a - b) < 1e-12 for r, s in zip(A, B) for a, b in zip(r, s))


def t_softmax_fully_masked_row_is_safe():
    """eqs. (2.3) and (2.5) on masked rows: an all -inf row gives zeros (not NaN) and a zero gradient; a
    masked entry gets probability and gradient 0."""
    A = core.softmax_rows([[-math.inf] * 3, [0.0, -math.inf, 0.0]])
    assert A[0] == [0.0, 0.0, 0.0]
    assert A[1] == [0.5, 0.0, 0.5]
    dS = core.softmax_backward(A, [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    assert dS[0] == [0.0, 0.0, 0.0] and dS[1][1] == 0.0


def t_softmax_backward_matches_jacobian():
    """eq. (2.5): softmax_backward p * (a - <a, p>) equals the explicit Jacobian (diag(p) - p p^T) times the
    upstream gradient."""
    rng = random.Random(2)
    for n in (1, 2, 5, 9):
        a = core.softmax_rows([[rng.gauss(0, 2) for _ in range(n)]])[0]
        da = [rng.gauss(0, 1) for _ in range(n)]
        J = [[(a[i] if i == j else 0.0) - a[i] * a[j] for j in range(n)] for i in range(n)]  # diag(p) - pp^T
        ref = [sum(J[i][j] * da[j] for j in range(n)) for i in range(n)]  # J is symmetric
        got = core.softmax_backward([a], [da])[0]
        scale = max(abs(x) for x in ref) or 1.0
        assert max(abs(x - y) for x, y in zip(got, ref)) / scale < 1e-12


def t_grad_gelu():
    """eq. (5.2): GELU in its tanh form, and gelu_grad against central differences."""
    assert core.gelu(0.0) == 0.0
    assert abs(core.gelu(1.0) - 0.8411919906082768) < 1e-15          # tanh form, not the erf form
    for x in (-4.0, -1.3, -0.2, 0.0, 0.4, 1.0, 2.7, 6.0):
        num = (core.gelu(x + 1e-4) - core.gelu(x - 1e-4)) / 2e-4
        assert core.grad_ok(core.gelu_grad(x), num), (x, core.gelu_grad(x), num)


def t_xavier_init_scale():
    """eq. (5.13): Xavier std sqrt(2 / (n_in + n_out)); LayerNorm starts at gamma = 1, beta = 0."""
    assert core.xavier_std(3, 5) == math.sqrt(2 / 8)
    lin = core.Linear(60, 40, rng=random.Random(0))
    w = [x for r in lin.W.data for x in r]
    var = sum(x * x for x in w) / len(w)
    assert abs(var - 2 / 100) / (2 / 100) < 0.1 and lin.b.data == [0.0] * 40
    ln = core.LayerNorm(4)
    assert ln.gamma.data == [1.0] * 4 and ln.beta.data == [0.0] * 4


def t_residual_output_projections_scaled_by_inv_sqrt_2L():
    # same seed, L = 1 vs L = 8: the W_o and FFN-out projections shrink by sqrt(16 / 2) relative to the rest
    def std(p):
        w = [x for r in p.data for x in r]
        return math.sqrt(sum(x * x for x in w) / len(w))
    a = core.TransformerLM(8, 32, 2, 1, 64, seed=3)
    b = core.TransformerLM(8, 32, 2, 8, 64, seed=3)
    ra = std(a.blocks[0].self_attn.o.W) / std(a.blocks[0].self_attn.qkv.W)
    rb = std(b.blocks[0].self_attn.o.W) / std(b.blocks[0].self_attn.qkv.W)
    assert 2.3 < ra / rb < 3.4          # sqrt(16) / sqrt(2) = 2.83 up to sampling noise


# ----------------------------------------------------------------------------- positions


def t_sine_table_values():
    """eq. (4.4): PE[t][2i] = sin(t w_i), PE[t][2i+1] = cos(t w_i); every row has norm sqrt(d/2)."""
    pe = core.sine_cosine_table(3, 4)
    assert pe[0] == [0.0, 1.0, 0.0, 1.0]
    assert pe[2][0] == math.sin(2.0) and pe[2][3] == math.cos(2 * 10000 ** (-2 / 4))
    for row in core.sine_cosine_table(50, 16):
        assert abs(math.sqrt(sum(x * x for x in row)) - math.sqrt(8)) < 1e-12   # norm sqrt(d/2)


def t_sine_addition_theorem():
    """eq. (4.4): PE[t+k] is a fixed rotation R_k of PE[t] (the addition theorem), for every t."""
    d, T = 16, 40
    pe = core.sine_cosine_table(T, d)
    for k in (1, 5, 13):
        for t in (0, 3, 20):
            rot = []
            for i in range(0, d, 2):
                w = 10000 ** (-i / d)
                c, s = math.cos(k * w), math.sin(k * w)
                x, y = pe[t][i], pe[t][i + 1]          # (sin, cos) of t w
                rot += [x * c + y * s, -x * s + y * c]  # R_k (sin t w, cos t w) = (sin (t+k) w, cos (t+k) w)
            assert max(abs(a - b) for a, b in zip(rot, pe[t + k])) < 1e-12


def t_sine_inner_product_identity():
    """eq. (4.4): <PE[t], PE[t+k]> = sum_i cos(k w_i) depends on the offset k only."""
    d, T = 16, 60
    pe = core.sine_cosine_table(T, d)
    for k in (0, 1, 7, 20):
        closed = sum(math.cos(k * 10000 ** (-i / d)) for i in range(0, d, 2))
        for t in range(0, T - k, 9):
            assert abs(core.dot(pe[t], pe[t + k]) - closed) < 1e-12


def t_rope_relative_position_property():
    """eq. (4.7): <R(m) q, R(m + delta) k> does not depend on m (RoPE sees relative positions)."""
    rng = random.Random(4)
    for _ in range(20):
        q = [rng.gauss(0, 1) for _ in range(8)]
        k = [rng.gauss(0, 1) for _ in range(8)]
        m, delta = rng.randrange(50), rng.randrange(1, 40)
        base = core.dot(core.rope_rotate(q, 0), core.rope_rotate(k, delta))
        shifted = core.dot(core.rope_rotate(q, m), core.rope_rotate(k, m + delta))
        assert abs(base - shifted) < 1e-12 * max(1.0, abs(base))


def t_rope_inverse_undoes_rotate_and_rows_agree():
    """eq. (4.7): the inverse rotation undoes RoPE (it is also RoPE's backward), rope_rows equals rope_rotate
    row by row, and norms are kept."""
    rng = random.Random(5)
    X = _rmat(rng, 6, 8)
    for t, x in enumerate(X):
        back = core.rope_rotate_inverse(core.rope_rotate(x, t), t)
        assert max(abs(a - b) for a, b in zip(back, x)) < 1e-14
    rows = core.rope_rows(X)
    assert all(max(abs(a - b) for a, b in zip(rows[t], core.rope_rotate(X[t], t))) < 1e-15 for t in range(6))
    inv = core.rope_rows(rows, inverse=True)
    assert all(abs(a - b) < 1e-14 for r, s in zip(inv, X) for a, b in zip(r, s))
    # the norm of each pair is preserved
    assert abs(core.dot(rows[5], rows[5]) - core.dot(X[5], X[5])) < 1e-12


# ----------------------------------------------------------------------------- gradient checks


def t_grad_linear():
    """eq. (2.15): Linear's backward, dW = X^T dY, db = sum_t dY[t], dX = dY W^T, against central
    differences."""
    rng = random.Random(10)
    _module_check(core.Linear(5, 3, rng=rng), _rmat(rng, 4, 5), rng, label="Linear")


def t_grad_linear_without_bias():
    """eq. (2.15): Linear without bias, dW = X^T dY and dX = dY W^T, against central differences."""
    rng = random.Random(11)
    lin = core.Linear(3, 4, bias=False, rng=rng)
    assert len(lin.params()) == 1
    _module_check(lin, _rmat(rng, 2, 3), rng, label="Linear(bias=False)")


def t_grad_layernorm():
    """eqs. (5.7)/(5.11): LayerNorm's backward in its intermediate-variable form, against central differences
    (gamma, beta and the input)."""
    rng = random.Random(12)
    ln = core.LayerNorm(6)
    ln.gamma.data = [rng.gauss(1, 0.3) for _ in range(6)]   # away from the identity init
    ln.beta.data = [rng.gauss(0, 0.3) for _ in range(6)]
    _module_check(ln, _rmat(rng, 3, 6, 2.0), rng, label="LayerNorm")


def t_grad_embedding_scatter_adds_repeated_ids():
    """The input path of eq. (8.5): an embedding's gradient scatter-adds dX rows, so a repeated id gets the
    sum of its rows."""
    rng = random.Random(13)
    emb = core.Embedding(6, 3, rng=rng)
    ids = [2, 4, 2, 0]
    R = _rmat(rng, 4, 3)

    def loss(backward):
        L = _proj(emb.forward(ids), R)
        if backward:
            emb.backward(R)
        return L
    _check(loss, emb.params(), "Embedding")
    emb.zero_grad()
    loss(True)
    assert emb.W.grad[2] == [a + b for a, b in zip(R[0], R[2])] and emb.W.grad[5] == [0.0] * 3


def t_grad_feedforward():
    """eqs. (5.1)/(5.2): FFN(x) = GELU(x W1 + b1) W2 + b2, every parameter and the input against central
    differences."""
    rng = random.Random(14)
    _module_check(core.FeedForward(4, 6, rng=rng), _rmat(rng, 3, 4), rng, label="FeedForward")


def t_grad_attention_causal():
    """eqs. (2.11)-(2.16) with the causal mask of eq. (6.1): multi-head attention's backward against central
    differences."""
    rng = random.Random(15)
    _module_check(core.MultiHeadAttention(6, 2, rng=rng, causal=True), _rmat(rng, 4, 6), rng, label="MHA causal")


def t_grad_attention_unmasked_with_one_token():
    """eqs. (2.11)-(2.16) without a mask, for one token and for three: attention's backward against central
    differences."""
    rng = random.Random(16)
    mha = core.MultiHeadAttention(4, 2, rng=rng)
    _module_check(mha, _rmat(rng, 1, 4), rng, label="MHA T=1")
    _module_check(mha, _rmat(rng, 3, 4), rng, label="MHA unmasked")


def t_grad_attention_rope():
    """eqs. (2.11)-(2.16) with RoPE (eq. 4.7) on Q and K: the backward rotates dQ and dK back; against
    central differences."""
    rng = random.Random(17)
    _module_check(core.MultiHeadAttention(8, 2, rng=rng, causal=True, rope=True), _rmat(rng, 4, 8), rng,
                  label="MHA RoPE")


def t_grad_attention_padding():
    """eqs. (2.11)-(2.16) with a padded key: against central differences, and the padded key gets exactly
    zero weight."""
    rng = random.Random(18)
    mha = core.MultiHeadAttention(4, 2, rng=rng)
    X = _rmat(rng, 4, 4)
    R = _rmat(rng, 4, 4)
    pad = [False, False, True, False]

    def loss(backward):
        L = _proj(mha.forward(X, key_padding_mask=pad), R)
        if backward:
            mha.backward(R)
        return L
    _check(loss, mha.params(), "MHA padding")
    for h in mha.heads:                       # the padded key gets exactly zero weight
        assert all(row[2] == 0.0 for row in h[3])


def _cross_attention_check(mha, rng, label):
    """Finite differences of cross-attention: every parameter, the queries X and the memory M."""
    X, M = _rmat(rng, 3, 4), _rmat(rng, 5, 4)     # T = 3 queries, S = 5 keys
    R = _rmat(rng, 3, 4)

    def loss(backward):
        L = _proj(mha.forward(X, M), R)
        if backward:
            mha.backward(R)
        return L
    _check(loss, mha.params(), label)
    mha.forward(X, M)
    dX, dM = mha.backward(R)
    for inp, grad in ((X, dX), (M, dM)):
        num = core.numerical_grad(lambda: loss(False), inp)
        assert all(core.grad_ok(a, n) for r, s in zip(grad, num) for a, n in zip(r, s))


def t_grad_attention_cross_both_inputs():
    """eqs. (2.11)-(2.16) for cross-attention: the gradients of the parameters, the queries X and the memory
    M."""
    rng = random.Random(19)
    _cross_attention_check(core.MultiHeadAttention(4, 2, rng=rng, cross=True), rng, "MHA cross")


def t_grad_attention_head_mask():
    """eqs. (2.11)-(2.16) with a head mask: c_h scales head h's output O_h before W_o.  The backward against
    finite differences (every parameter and the input), for self-attention (causal, RoPE) and
    cross-attention (both inputs)."""
    rng = random.Random(41)
    mha = core.MultiHeadAttention(6, 3, rng=rng, causal=True, rope=True)
    mha.head_mask = [1.0, 0.0, 0.5]
    _module_check(mha, _rmat(rng, 4, 6), rng, label="MHA head mask")
    cross = core.MultiHeadAttention(4, 2, rng=rng, cross=True)
    cross.head_mask = [0.25, 1.0]
    _cross_attention_check(cross, rng, "MHA cross head mask")


def t_head_mask_ones_is_exact_and_zero_removes_the_head():
    rng = random.Random(42)
    mha = core.MultiHeadAttention(6, 3, rng=rng, causal=True)
    X = _rmat(rng, 5, 6)
    plain = mha.forward(X)
    mha.head_mask = [1.0, 1.0, 1.0]
    assert mha.forward(X) == plain                                   # factors 1: bit-identical
    mha.head_mask = [1.0, 0.0, 1.0]
    Y = mha.forward(X)
    mha.head_mask = None
    mha.forward(X)
    O = [a + [0.0] * 2 + c for a, _, c in zip(*[core.matmul(h[3], h[2]) for h in mha.heads])]   # head 1 dropped
    assert Y == mha.o.apply(O)
    # the training forward keeps its factors for backward even if head_mask changes in between
    mha.head_mask = [1.0, 0.0, 1.0]
    mha.forward(X)
    mha.head_mask = None
    mha.zero_grad()
    mha.backward(_rmat(rng, 5, 6))
    assert all(g == 0.0 for row in mha.o.W.grad[2:4] for g in row)   # W_o rows of head 1 see O_1 = 0


def t_attention_mask_causal_rows_and_padding():
    """eq. (6.1): the causal mask hides keys j > t (the last T of S positions when a cache holds S); padded
    keys are hidden from every query."""
    inf = math.inf
    assert core.attention_mask(3, 3, causal=True) == [[0.0, -inf, -inf], [0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
    assert core.attention_mask(2, 4, causal=True) == [[0.0, 0.0, 0.0, -inf], [0.0] * 4]   # the last 2 of 4
    assert core.attention_mask(1, 4, causal=True) is None                 # the newest query sees every key
    assert core.attention_mask(2, 3) is None and core.attention_mask(2, 3, key_padding_mask=None) is None
    assert core.attention_mask(2, 3, key_padding_mask=[False, True, False]) == [[0.0, -inf, 0.0]] * 2
    assert core.attention_mask(2, 2, causal=True, key_padding_mask=[True, False]) == [[-inf, -inf], [-inf, 0.0]]
    _raises(core.ShapeError, lambda: core.attention_mask(2, 3, key_padding_mask=[True]))   # S = 3 keys
    assert core.padding_mask([3, 0, 4], 0) == [False, True, False]
    assert core.padding_mask([3, 4], 0) is None and core.padding_mask([0, 0], None) is None
    # a masked key's -inf gives the very floats of a softmax over the visible keys padded with zeros
    rng = random.Random(43)
    for n in range(1, 12):
        row = [rng.gauss(0.0, 3.0) for _ in range(12)]
        masked = core.softmax_rows([[s + m for s, m in zip(row, [0.0] * n + [-inf] * (12 - n))]])[0]
        assert masked == core.softmax_rows([row[:n]])[0] + [0.0] * (12 - n)


def t_grad_encoder_block():
    """eq. (5.4): the Pre-LN encoder block X + MHA(LN X), then + FFN(LN X), against central differences."""
    rng = random.Random(20)
    _module_check(core.EncoderBlock(4, 2, 6, rng=rng), _rmat(rng, 3, 4), rng, label="EncoderBlock")


def t_grad_decoder_block_with_memory():
    """eq. (5.4): the Pre-LN decoder block (causal self-attention, cross-attention, FFN); gradients of the
    parameters, X and the memory."""
    rng = random.Random(21)
    blk = core.DecoderBlock(4, 2, 6, rng=rng)
    X, M = _rmat(rng, 3, 4), _rmat(rng, 2, 4)
    R = _rmat(rng, 3, 4)

    def loss(backward):
        L = _proj(blk.forward(X, M), R)
        if backward:
            blk.backward(R)
        return L
    _check(loss, blk.params(), "DecoderBlock")
    blk.forward(X, M)
    dX, dM = blk.backward(R)
    for inp, grad in ((X, dX), (M, dM)):
        num = core.numerical_grad(lambda: loss(False), inp)
        assert all(core.grad_ok(a, n) for r, s in zip(grad, num) for a, n in zip(r, s))


def t_grad_lm_tied_two_layers():
    """eq. (8.5): the tied embedding's gradient (input scatter-add + H^T dlogits) through a 2-layer LM and
    the loss of eq. (6.4)."""
    lm = core.TransformerLM(6, 4, 2, 2, 6, pos="learned", max_len=5, tie_weights=True, seed=1)
    ids = [1, 3, 3, 5, 0]
    rep = _check(lambda b: core.lm_loss(lm, ids, backward=b), lm.params(), "TransformerLM tied")
    assert rep["n_params"] == core.param_count(lm)


def t_grad_lm_rope_untied():
    """eqs. (2.11)-(2.16), (4.7), (6.4): an untied RoPE LM, every parameter against central differences."""
    lm = core.TransformerLM(5, 4, 2, 1, 6, pos="rope", seed=2)
    _check(lambda b: core.lm_loss(lm, [0, 4, 1, 2], backward=b), lm.params(), "TransformerLM RoPE")


def t_grad_encoder_decoder():
    """eqs. (2.11)-(2.16), (5.4), (6.4): every parameter of an EncoderDecoder with a padded source, against
    central differences."""
    s2s = core.EncoderDecoder(6, 5, 4, 2, 1, 6, pos="sine", src_pad_id=0, seed=3)
    sample = ([2, 5, 3, 0], [1, 4, 2, 3])
    _check(lambda b: core.seq2seq_loss(s2s, sample, backward=b), s2s.params(), "EncoderDecoder")


def t_grad_encoder_regression_with_padding():
    """eq. (5.4) and the mean-squared error: every parameter of a regression encoder with padding, against
    central differences."""
    enc = core.TransformerEncoder(6, 4, 2, 2, 6, n_out=2, pos="learned", max_len=5, pad_id=0, seed=4)
    _check(lambda b: core.regression_loss(enc, ([3, 1, 5, 0], [0.7, -1.2]), backward=b), enc.params(),
           "TransformerEncoder")


def _features(V, k, seed=5):
    rng = random.Random(seed)
    return [[rng.gauss(0, 1) for _ in range(k)] for _ in range(V)]


def t_grad_encoder_with_token_features():
    """Not a tutorial equation (this library's addition): X = E[ids] + F[ids] W_f + P, where the projection
    W_f of fixed per-token features (periodic-table priors) is trained; against central differences."""
    enc = core.TransformerEncoder(6, 4, 2, 1, 6, n_out=1, pos="sine", pad_id=0, seed=6, token_features=_features(6, 3))
    rep = _check(lambda b: core.regression_loss(enc, ([3, 1, 5, 3, 0], 0.4), backward=b), enc.params(),
                 "TransformerEncoder + token features")
    assert "embed.feat.W" in rep["per_param"]
    assert core.param_count(enc) == core.param_count_formula(enc)
    with tempfile.TemporaryDirectory() as d:            # the features travel with the saved model
        core.save_model(enc, os.path.join(d, "m.json"))
        back = core.load_model(os.path.join(d, "m.json"))
        assert back.forward([3, 1, 5]) == enc.forward([3, 1, 5])
    _raises(core.ShapeError, lambda: core.TransformerEncoder(6, 4, 2, 1, 6, token_features=_features(5, 3)))


def t_grad_cross_entropy_label_smoothing():
    """eq. (6.4): the cross-entropy gradient p - q (q the smoothed one-hot) against central differences;
    ignored rows get 0."""
    rng = random.Random(22)
    logits = _rmat(rng, 4, 5, 2.0)
    targets = [1, -100, 4, 0]
    for eps in (0.0, 0.1):
        loss, d = core.cross_entropy_rows(logits, targets, ignore_index=-100, label_smoothing=eps)
        num = core.numerical_grad(lambda: core.cross_entropy_rows(logits, targets, -100, eps)[0], logits)
        assert all(core.grad_ok(a, n) for r, s in zip(d, num) for a, n in zip(r, s))
        assert d[1] == [0.0] * 5


def t_gradient_check_catches_a_wrong_backward():
    class Broken(core.Linear):
        def backward(self, dY):
            dX = super().backward(dY)
            self.b.grad[0] *= 1.001           # a 0.1% error in one bias entry
            return dX
    rng = random.Random(23)
    lin = Broken(3, 2, rng=rng)
    X, R = _rmat(rng, 2, 3), _rmat(rng, 2, 2)

    def loss(backward):
        L = _proj(lin.forward(X), R)
        if backward:
            lin.backward(R)
        return L
    rep = core.gradient_check(loss, lin.params())
    assert not rep["ok"] and rep["n_failed"] == 1 and rep["per_param"][lin.b.name]["n_failed"] == 1


def t_grad_ok_thresholds():
    assert core.grad_ok(1.0, 1.0 + 5e-6) and not core.grad_ok(1.0, 1.0 + 5e-5)
    assert core.grad_ok(1e-9, 5e-9)                      # absolute error < 1e-8
    assert not core.grad_ok(1e-6, 2e-6)                  # both tests fail
    assert core.grad_ok(0.0, 0.0)


# ----------------------------------------------------------------------------- masks and symmetry


def t_causality_no_future_leak():
    """eq. (6.1): with the causal mask no output depends on a later token, in the values and in the
    gradients."""
    lm = core.TransformerLM(7, 8, 2, 2, 12, pos="rope", tie_weights=False, seed=5)
    a = [1, 2, 3, 4, 5, 6]
    b = a[:3] + [0, 0, 6]
    la, lb = lm.forward(a), lm.forward(b)
    assert la[:3] == lb[:3]                             # bit-identical
    assert la[3] != lb[3]
    # gradient of the first 3 outputs with respect to later inputs is exactly zero:
    # tokens 4, 5, 6 sit only at positions 3..5, so their embedding rows get no gradient at all
    lm.zero_grad()
    lm.forward(a)
    R = _rmat(random.Random(6), 3, 7) + [[0.0] * 7 for _ in range(3)]
    lm.backward(R)
    E = lm.embed.tok.W
    assert all(g == 0.0 for i in (4, 5, 6) for g in E.grad[i])
    assert any(g != 0.0 for g in E.grad[3])
    mha = core.MultiHeadAttention(4, 2, rng=random.Random(7), causal=True)
    mha.forward(_rmat(random.Random(8), 5, 4))
    dX = mha.backward([[1.0] * 4, [0.5] * 4] + [[0.0] * 4] * 3)
    assert all(g == 0.0 for row in dX[2:] for g in row) and any(g != 0.0 for g in dX[1])


def t_padding_keys_are_ignored():
    enc = core.TransformerEncoder(6, 4, 2, 1, 6, pos="sine", pad_id=0, seed=6)
    y1 = enc.forward([3, 4, 5, 0, 0])
    y2 = enc.forward([3, 4, 5, 0])
    y3 = enc.forward([3, 4, 5])
    assert abs(y1[0] - y3[0]) < 1e-12 and abs(y2[0] - y3[0]) < 1e-12
    e = _raises(ValueError, lambda: enc.forward([0, 0]))
    assert "padding" in str(e)


def t_permutation_equivariance_with_pos_none():
    rng = random.Random(9)
    blk = core.EncoderBlock(4, 2, 6, rng=rng)
    X = _rmat(rng, 5, 4)
    perm = [3, 0, 4, 1, 2]
    Y = blk.forward(X)
    Yp = blk.forward([X[i] for i in perm])
    assert all(abs(a - b) < 1e-12 for i, row in enumerate(Yp) for a, b in zip(row, Y[perm[i]]))
    enc = core.TransformerEncoder(8, 4, 2, 2, 6, pos="none", seed=7)
    ids = [1, 5, 2, 7, 3]
    assert abs(enc.forward(ids)[0] - enc.forward(ids[::-1])[0]) < 1e-12   # mean pooling: invariant


def t_positions_break_permutation_symmetry():
    ids = [1, 5, 2, 7, 3]
    for pos in ("sine", "learned", "rope"):
        enc = core.TransformerEncoder(8, 4, 2, 2, 6, pos=pos, max_len=8, seed=7)
        if pos == "learned":                                 # make the table matter
            enc.embed.pe.W.data = _rmat(random.Random(1), 8, 4)
        assert abs(enc.forward(ids)[0] - enc.forward(ids[::-1])[0]) > 1e-6, pos


def t_learned_positions_beyond_table_raise():
    lm = core.TransformerLM(5, 4, 2, 1, 6, pos="learned", max_len=4)
    e = _raises(core.ShapeError, lambda: lm.forward([1, 2, 3, 4, 1]))
    assert "max_len=4" in str(e) and "length 5" in str(e)
    e = _raises(ValueError, lambda: core.TransformerLM(5, 4, 2, 1, 6, pos="alibi"))
    assert "alibi" in str(e)


# ----------------------------------------------------------------------------- counting


def t_param_count_formula():
    lm = core.TransformerLM(10, 8, 2, 2, 16, pos="sine", tie_weights=False)
    assert core.param_count(lm) == core.param_count_formula(lm) == 1386
    tied = core.TransformerLM(10, 8, 2, 2, 16, pos="sine", tie_weights=True)
    assert core.param_count(tied) == core.param_count_formula(tied) == 1386 - 90
    for m in (core.TransformerLM(7, 8, 4, 3, 12, pos="learned", max_len=9, tie_weights=True),
              core.TransformerEncoder(9, 8, 2, 2, 16, n_out=3, pos="learned", max_len=6),
              core.EncoderDecoder(9, 7, 8, 2, 2, 16, pos="rope")):
        assert core.param_count(m) == core.param_count_formula(m)
    names = [p.name for p in tied.params()]
    assert len(names) == len(set(names))               # unique names, tied matrix listed once


# ----------------------------------------------------------------------------- losses


def t_cross_entropy_values_and_ignore_index():
    """eq. (6.4): the mean cross-entropy and its gradient (p - onehot) / N by hand; ignored rows count for
    nothing."""
    logits = [[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 1.0]]
    loss, d = core.cross_entropy_rows(logits, [0, 0, -1], ignore_index=-1)
    assert abs(loss - (math.log(2) + math.log(4 / 3)) / 2) < 1e-15
    assert abs(d[0][0] - (0.5 - 1) / 2) < 1e-15 and d[2] == [0.0, 0.0]
    loss, d = core.cross_entropy_rows(logits, [-1, -1, -1], ignore_index=-1)
    assert loss == 0.0 and d == [[0.0, 0.0]] * 3
    e = _raises(ValueError, lambda: core.cross_entropy_rows(logits, [0, 2, 1]))
    assert "target 2" in str(e)


def t_cross_entropy_label_smoothing_convention():
    """eq. (6.4) with label smoothing: q = (1 - eps) onehot + eps / V over all V classes (PyTorch's
    convention), gradient p - q."""
    # q = (1 - eps) onehot + eps / V over all V classes (PyTorch's convention)
    z, y, eps = [1.0, -0.5, 2.0], 0, 0.2
    lse = math.log(sum(math.exp(v) for v in z))
    logp = [v - lse for v in z]
    q = [(1 - eps) * (i == y) + eps / 3 for i in range(3)]
    loss, d = core.cross_entropy_rows([z], [y], label_smoothing=eps)
    assert abs(loss + sum(qi * lp for qi, lp in zip(q, logp))) < 1e-14
    assert all(abs(g - (math.exp(lp) - qi)) < 1e-15 for g, lp, qi in zip(d[0], logp, q))


def t_mse_loss():
    loss, d = core.mse_loss([1.0, 3.0], [0.0, 1.0])
    assert loss == 2.5 and d == [1.0, 2.0]


# ----------------------------------------------------------------------------- optimiser


def t_adam_first_step_bias_correction():
    """eqs. (7.7)/(7.8): bias-corrected Adam, the first two steps worked out by hand."""
    p = core.Param([[0.5, -1.0]], "w")
    p.grad = [[0.2, -3.0]]
    opt = core.Adam([p], lr=0.1, eps=1e-8)
    opt.step()
    # m_hat = g, v_hat = g^2 after bias correction, so the first update is lr * g / (|g| + eps)
    assert abs(p.data[0][0] - (0.5 - 0.1 * 0.2 / (0.2 + 1e-8))) < 1e-15
    assert abs(p.data[0][1] - (-1.0 + 0.1 * 3.0 / (3.0 + 1e-8))) < 1e-15
    # second step by hand
    p.grad = [[0.1, 1.0]]
    m = 0.9 * 0.02 + 0.1 * 0.1
    v = 0.999 * 0.00004 + 0.001 * 0.01
    w = p.data[0][0]
    opt.step()
    expect = w - 0.1 * (m / (1 - 0.9 ** 2)) / (math.sqrt(v / (1 - 0.999 ** 2)) + 1e-8)
    assert abs(p.data[0][0] - expect) < 1e-14


def t_adam_weight_decay_is_decoupled():
    p = core.Param([2.0], "w")
    p.grad = [0.0]                                   # zero gradient: only the decay moves the weight
    opt = core.Adam([p], lr=0.1, weight_decay=0.5)
    opt.step()
    assert abs(p.data[0] - 2.0 * (1 - 0.1 * 0.5)) < 1e-15


def t_clip_grad_norm_preserves_direction():
    """eq. (8.3): global-norm clipping scales every gradient by max_norm / (norm + 1e-6) and keeps the
    direction."""
    a, b = core.Param([[3.0, 0.0]], "a"), core.Param([4.0], "b")
    a.grad, b.grad = [[3.0, 0.0]], [4.0]
    norm, coef = core.clip_grad_norm([a, b], 1.0)
    assert norm == 5.0 and coef == 1.0 / (5.0 + 1e-6)
    assert abs(a.grad[0][0] - 0.6) < 1e-6 and abs(b.grad[0] - 0.8) < 1e-6
    assert abs(a.grad[0][0] / b.grad[0] - 0.75) < 1e-15
    norm, coef = core.clip_grad_norm([a, b], 10.0)
    assert norm < 1.0 and coef == 1.0 and abs(b.grad[0] - 0.8) < 1e-6    # below max: untouched
    # train's call: Param.grad holds the SUM of 4 per-sample gradients; the norm and factor are those of
    # their mean, and with scale=False nothing is changed (train folds the factor into Adam.step)
    a.grad, b.grad = [[12.0, 0.0]], [16.0]
    assert core.clip_grad_norm([a, b], 1.0, batch_size=4, scale=False) == (5.0, 1.0 / (5.0 + 1e-6))
    assert a.grad == [[12.0, 0.0]] and b.grad == [16.0]
    assert core.clip_grad_norm([a, b], 0.0, batch_size=4) == (5.0, 1.0)   # max_norm 0: no clipping


def t_noam_peak_at_warmup():
    """eq. (8.1): lr = d^-0.5 min(t^-0.5, t w^-1.5) peaks at step w after a linear warmup; warmup_inv_sqrt_lr
    has the same shape with a given peak."""
    lrs = [core.noam_lr(s, 64, 100) for s in range(0, 400)]
    assert lrs[0] == 0.0 and max(range(400), key=lrs.__getitem__) == 100
    assert abs(lrs[100] - 64 ** -0.5 * 100 ** -0.5) < 1e-15
    assert abs(core.noam_lr(50, 64, 100) - lrs[100] / 2) < 1e-15      # linear warmup
    w = [core.warmup_inv_sqrt_lr(s, 3e-3, 150) for s in (0, 75, 150, 600)]
    assert w == [0.0, 1.5e-3, 3e-3, 1.5e-3]


# ----------------------------------------------------------------------------- training


def _copy_task(n, rng):
    return [[rng.randrange(2, 6) for _ in range(3)] * 2 for _ in range(n)]


def t_train_reduces_loss_and_records_history():
    rng = random.Random(30)
    data = _copy_task(24, rng)
    lm = core.TransformerLM(6, 8, 2, 1, 16, pos="sine", seed=0)
    before = sum(core.lm_loss(lm, s, backward=False) for s in data) / len(data)
    hist = core.train(lm, data, core.lm_loss, valid_data=data[:4], epochs=6, batch_size=4, lr=1e-2, warmup=5,
                    workers=1, verbose=False)
    after = sum(core.lm_loss(lm, s, backward=False) for s in data) / len(data)
    assert after < 0.8 * before, (before, after)
    assert hist["n_steps"] == 36 and len(hist["steps"]) == 36 and len(hist["epochs"]) == 6
    assert {"train_loss", "valid_loss", "elapsed"} <= set(hist["epochs"][-1])
    assert hist["steps"][4]["lr"] == 1e-2 and hist["settings"]["workers"] == 1


def t_train_step_is_mean_then_clip_then_adam():
    """eqs. (8.3) and (7.8): one step of train() is the batch's mean gradient, clipped, then one Adam step,
    written out by hand."""
    # one step of train() == mean gradient over the batch, clip_grad_norm, Adam.step, written out by hand
    data = _copy_task(5, random.Random(33))
    a = core.TransformerLM(6, 4, 2, 1, 8, seed=4)
    b = core.TransformerLM(6, 4, 2, 1, 8, seed=4)
    core.train(a, data, core.lm_loss, epochs=1, batch_size=5, lr=0.05, warmup=1, clip=0.01, workers=1,
             verbose=False)
    b.zero_grad()
    for s in data:
        core.lm_loss(b, s)
    for p in b.params():
        for r in p.rows("grad"):
            r[:] = [x / 5 for x in r]
    norm, coef = core.clip_grad_norm(b.params(), 0.01)
    assert norm > 0.01 and coef < 1.0                          # the clip is active
    core.Adam(b.params(), lr=0.05).step()
    diff = max(abs(x - y) for p, q in zip(a.params(), b.params())
               for r, s in zip(p.rows(), q.rows()) for x, y in zip(r, s))
    assert diff < 1e-12, diff


def t_train_is_deterministic_for_a_seed():
    data = _copy_task(8, random.Random(31))
    out = []
    for _ in range(2):
        lm = core.TransformerLM(6, 4, 2, 1, 8, seed=1)
        core.train(lm, data, core.lm_loss, epochs=2, batch_size=3, workers=1, verbose=False, seed=5)
        out.append([p.data for p in lm.params()])
    assert out[0] == out[1]


def t_data_parallel_gradient_matches_serial():
    rng = random.Random(32)
    data = [[rng.randrange(2, 6) for _ in range(rng.randrange(2, 9))] for _ in range(7)]  # shares by length
    lm = core.TransformerLM(6, 8, 2, 2, 16, pos="rope", seed=2)
    params = lm.params()
    lm.zero_grad()
    serial_loss, n = core._Serial(lm, {"train": data}, core.lm_loss).run("grad", "train", list(range(7)))
    assert n == 7                                  # the count: 7 samples
    serial = [list(r) for p in params for r in p.rows("grad")]
    lm.zero_grad()
    dp = core._DataParallel(lm, {"train": data}, core.lm_loss, 2)
    try:
        par_loss, par_n = dp.run("grad", "train", list(range(7)))
        parallel = [list(r) for p in params for r in p.rows("grad")]
        eval_loss, _ = dp.run("eval", "train", list(range(7)))
    finally:
        dp.close()
    assert abs(serial_loss - par_loss) < 1e-12 and abs(eval_loss - serial_loss) < 1e-12 and par_n == 7
    assert max(abs(a - b) for r, s in zip(serial, parallel) for a, b in zip(r, s)) < 1e-12
    # and a whole (short) training run with 2 workers ends close to the serial one
    runs = []
    for w in (1, 2, 2):
        m = core.TransformerLM(6, 4, 2, 1, 8, seed=1)
        core.train(m, data, core.lm_loss, epochs=2, batch_size=4, workers=w, verbose=False)
        runs.append([x for p in m.params() for r in p.rows() for x in r])
    assert max(abs(a - b) for a, b in zip(runs[0], runs[1])) < 1e-9
    assert runs[1] == runs[2]                      # same seed + same worker count: bit-identical


def t_data_parallel_shares_balance_token_counts():
    lengths = [20, 1, 20, 1, 1, 1]
    data = [[2] * n for n in lengths]
    shares = core._balanced_shares(list(range(6)), data, 2)
    assert shares == [[0, 1, 4], [2, 3, 5]]           # 22 and 22 tokens; interleaving gives 41 and 3
    rng = random.Random(33)
    for _ in range(50):
        n_items, n = rng.randrange(1, 20), rng.randrange(1, 4)
        data = [([1] * rng.randrange(1, 60), 0.5) for _ in range(n_items)]
        idx = rng.sample(range(n_items), n_items)
        shares = core._balanced_shares(idx, data, n)
        assert sorted(i for s in shares for i in s) == sorted(idx)                     # a partition
        assert all(s == [i for i in idx if i in s] for s in shares)                   # batch order kept
        loads = [sum(len(data[i][0]) for i in s) for s in shares]
        assert max(loads) <= sum(loads) / n + max(len(x[0]) for x in data)            # the greedy bound


# ----------------------------------------------------------------------------- generation


def t_sampling_top_k1_equals_greedy():
    lm = core.TransformerLM(7, 8, 2, 1, 12, seed=8)
    g = core.greedy_decode(lm, [1], 6)
    assert len(g) == 6
    for seed in range(3):
        assert core.sample(lm, [1], 6, top_k=1, temperature=0.7, rng=random.Random(seed)) == g


def t_sampling_fixed_seed_reproducible():
    lm = core.TransformerLM(7, 8, 2, 1, 12, seed=8)
    a = core.sample(lm, [1], 8, temperature=1.5, rng=random.Random(3))
    b = core.sample(lm, [1], 8, temperature=1.5, rng=random.Random(3))
    c = [core.sample(lm, [1], 8, temperature=1.5, rng=random.Random(s)) for s in range(4, 9)]
    assert a == b and any(x != a for x in c)
    state = random.getstate()
    core.sample(lm, [1], 3, rng=11)
    assert random.getstate() == state                   # the global RNG is never touched


def t_generate_encoder_decoder_stops_at_eos():
    s2s = core.EncoderDecoder(6, 6, 4, 2, 1, 8, seed=9)
    out = core.greedy_decode(s2s, [1], 5, src=[3, 4, 5])
    assert len(out) == 5
    eos = out[2]
    stop = core.greedy_decode(s2s, [1], 5, src=[3, 4, 5], eos_id=eos)
    assert stop == out[:out.index(eos)]
    assert core.sample(s2s, [1], 5, src=[3, 4, 5], top_k=1) == out


# ----------------------------------------------------------------------------- persistence


def t_save_load_round_trip_bit_identical():
    with tempfile.TemporaryDirectory() as d:
        for model, run in ((core.TransformerLM(7, 8, 2, 2, 12, pos="learned", max_len=6, tie_weights=True, seed=3),
                            lambda m: m.forward([1, 2, 3])),
                           (core.TransformerEncoder(7, 8, 2, 1, 12, pos="rope", pad_id=0, seed=4),
                            lambda m: m.forward([1, 2, 0])),
                           (core.EncoderDecoder(7, 5, 8, 2, 1, 12, seed=5),
                            lambda m: m.forward([1, 2], [3, 4]))):
            path = os.path.join(d, type(model).__name__ + ".json")
            core.save_model(model, path, meta={"note": "test"})
            again = core.load_model(path)
            assert type(again) is type(model) and again.config == model.config
            assert run(again) == run(model)
            assert [p.data for p in again.params()] == [p.data for p in model.params()]
        assert [f for f in os.listdir(d) if f.startswith(".tmp")] == []


def t_load_rejects_corrupt_files():
    """Every problem with a model file is a ModelFormatError (a ValueError) naming the file and the problem, and
    the file is left as it was; a missing file is FileNotFoundError naming it."""
    lm = core.TransformerLM(5, 4, 2, 1, 6, seed=1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.json")
        core.save_model(lm, path)
        good = json.load(open(path))

        def expect(obj, fragment, raw=None):
            raw = raw if raw is not None else json.dumps(obj).encode()
            with open(path, "wb") as f:
                f.write(raw)
            e = _raises(core.ModelFormatError, lambda: core.load_model(path))
            assert isinstance(e, ValueError) and path in str(e) and fragment in str(e), str(e)
            assert open(path, "rb").read() == raw and os.listdir(d) == ["m.json"]
        expect(dict(good, version=99), "version 99")
        w = dict(good["weights"])
        del w["ln_f.gamma"]
        expect(dict(good, weights=w), "ln_f.gamma")
        expect(dict(good, weights=dict(good["weights"], **{"head.b": [0.0] * 4})), "head.b")
        expect(dict(good, weights=dict(good["weights"], **{"ln_f.gamma": ["x"] * 4})), "ln_f.gamma")
        expect(dict(good, weights=[1]), "weights")
        expect(dict(good, config=dict(good["config"], n_heads=3)), "bad config")
        expect(dict(good, **{"class": "Nope"}), "Nope")
        expect(None, "not valid JSON", raw=json.dumps(good)[:100].encode())
        expect(None, "not valid JSON", raw=b"\xe9\xff{}")
        e = _raises(FileNotFoundError, lambda: core.load_model(os.path.join(d, "none.json")))
        assert "none.json" in str(e)


def t_save_refuses_nan_and_keeps_old_file():
    lm = core.TransformerLM(5, 4, 2, 1, 6, seed=1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.json")
        core.save_model(lm, path)
        before = open(path).read()
        lm.ln_f.beta.data[0] = float("nan")
        e = _raises(ValueError, lambda: core.save_model(lm, path))
        assert "NaN" in str(e)
        assert open(path).read() == before and os.listdir(d) == ["m.json"]


# ----------------------------------------------------------------------------- damaged checkpoints


def _checkpointed_run(d):
    """A 3-step checkpointed training run of a tiny LM in folder d: (train(...) as a function of a fresh
    model, the checkpoint path, the finished run's checkpoint as parsed JSON)."""
    data = [[1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2]]
    path = os.path.join(d, "ck.json")

    def run(model):
        return core.train(model, data, core.lm_loss, epochs=2, batch_size=2, max_steps=3, workers=1,
                        verbose=False, checkpoint=path)
    run(core.TransformerLM(5, 4, 2, 1, 6, seed=1))
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    return run, path, obj


def t_damaged_checkpoint_names_the_file_and_field_and_changes_nothing():
    with tempfile.TemporaryDirectory() as d:
        run, path, good = _checkpointed_run(d)

        def expect(obj, field, raw=None):
            text = raw if raw is not None else json.dumps(obj)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            model = core.TransformerLM(5, 4, 2, 1, 6, seed=1)
            model.params()[0].data[0][0] = 0.5                                  # to see that nothing is loaded
            before = [json.dumps(p.data) for p in model.params()]
            e = _raises(core.CheckpointMismatchError, lambda: run(model))
            assert path in str(e) and field in str(e), str(e)
            assert [json.dumps(p.data) for p in model.params()] == before       # nothing was loaded
            assert open(path, encoding="utf-8").read() == text                  # the file is untouched
            assert sorted(os.listdir(d)) == ["ck.json"]
        expect({k: v for k, v in good.items() if k != "adam"}, "'adam' is missing")
        w = dict(good["weights"], **{"blocks.0.ffn.fc2.W": [[0.0] * 4] * 5})    # wrong shape
        expect(dict(good, weights=w), "weights.blocks.0.ffn.fc2.W")
        expect(dict(good, progress=dict(good["progress"], step=999)), "progress.step")
        expect(dict(good, adam=dict(good["adam"], t=1)), "adam.t")
        m = [list(x) for x in good["adam"]["m"]][:-1]
        expect(dict(good, adam=dict(good["adam"], m=m)), "adam.m")
        expect(dict(good, history=dict(good["history"], steps=[])), "history.steps")
        expect(dict(good, rng=[3, [1, 2], None]), "rng")
        expect(None, "unreadable", raw=json.dumps(good)[:200])
        with open(path, "w", encoding="utf-8") as f:                            # the intact one resumes
            json.dump(good, f)
        assert run(core.TransformerLM(5, 4, 2, 1, 6, seed=1))["n_steps"] == 3


def t_runner_help_and_unknown_options():
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(argv=["--help"]) == 0
        assert main(argv=["--no-such-option"]) == 2
        assert main(argv=["no_test_has_this_name"]) == 2
    assert out.getvalue().startswith("usage:") and "finite differences" in out.getvalue()
    assert " passed" not in out.getvalue()                                      # nothing ran
    assert "--no-such-option" in err.getvalue() and "no_test_has_this_name" in err.getvalue()


# ----------------------------------------------------------------------------- dropout and the per-token loss


def t_dropout_masks_are_inverted_and_drawn_only_in_training_mode():
    """Section 5.6, inverted dropout: a mask entry is 0 or 1/(1-p), kept with probability 1 - p (so E[m] = 1)
    and Y = X * M; inference mode (the default: validation, apply, generation) or p = 0: no mask at all;
    training mode without an rng is refused, naming the layer; a rate outside [0, 1) is refused."""
    drop = core.Dropout(0.25)
    X = [[1.0] * 50 for _ in range(200)]
    assert drop.forward(X) is X and drop.mask is None                # inference mode: nothing is dropped
    drop.train(random.Random(0))
    Y = drop.forward(X)
    M = drop.mask
    assert Y == M                                                     # X = 1: Y is the mask itself
    values = {x for r in M for x in r}
    assert values == {0.0, 1.0 / 0.75}, values
    kept = sum(x > 0 for r in M for x in r) / 10000
    assert abs(kept - 0.75) < 0.02, kept                              # keep probability 1 - p
    zero = core.Dropout(0.0).train(random.Random(0))
    assert zero.forward(X) is X and zero.mask is None
    e = _raises(ValueError, lambda: core.Dropout(0.5, name="blocks.0.drop1").train().forward(X))
    assert "'blocks.0.drop1'" in str(e) and "train(rng)" in str(e)
    for bad in (1.0, -0.1, "0.1", True):
        assert repr(bad) in str(_raises(ValueError, lambda: core.Dropout(bad)))
    assert "1.5" in str(_raises(ValueError, lambda: core.TransformerLM(5, 4, 2, 1, 6, dropout=1.5)))


def t_grad_dropout_layer_with_a_fixed_mask():
    """Section 5.6: Dropout is a layer like the others: in training mode, with its mask held fixed (a fresh
    random.Random(7) before each forward), its backward dX = dY * M is the input gradient of Y = X * M
    against central differences (it has no parameters), and something was dropped."""
    rng = random.Random(12)
    drop = core.Dropout(0.3, name="drop")
    X, R = _rmat(rng, 5, 7), _rmat(rng, 5, 7)

    def loss(backward):                                               # L = sum(Y * R)
        drop.train(random.Random(7))                                  # the same mask at every call
        return _proj(drop.forward(X), R)
    assert drop.params() == []
    loss(True)
    dX = drop.backward(R)                                             # dL/dX = R * M
    num = core.numerical_grad(lambda: loss(False), X)
    for a_row, n_row in zip(dX, num):
        for a, n in zip(a_row, n_row):
            assert core.grad_ok(a, n), f"Dropout: input gradient {a} vs numeric {n}"
    assert any(m == 0.0 for r in drop.mask for m in r) and any(m > 1.0 for r in drop.mask for m in r)


def _dropout_layers(model):
    return [m for m in model.modules() if isinstance(m, core.Dropout)]


def t_eval_mode_draws_no_mask_and_is_the_identity():
    """Section 5.6: ``eval()`` (inference mode, also a new model's mode) turns every Dropout of a model into
    the identity: no mask is drawn (the rng is never called), every layer's mask is None, and the forward
    and backward equal those of a rate-0 twin bit for bit; ``train(rng)`` then drops, and ``eval()`` undoes it."""
    model, plain = core.TransformerLM(7, 8, 2, 2, 12, seed=5, dropout=0.4), core.TransformerLM(7, 8, 2, 2, 12, seed=5)
    layers = _dropout_layers(model)           # the embedding's; per block one per head, two branches, the FFN's
    assert len(layers) == 1 + 2 * (2 + 3) and {d.p for d in layers} == {0.4}
    assert not model.training and model.dropout_rng is None           # a new model is in inference mode
    ids, rng = [1, 2, 3, 4, 5], random.Random(3)
    model.train(rng)
    assert model.training and all(d.training and d.rng is rng for d in layers)
    dropped = model.forward(ids)
    assert dropped != plain.forward(ids) and model.dropout_rng is rng
    model.eval()
    assert all(d.rng is None for d in layers)
    for d in layers:
        d.rng = rng                                                   # even with an rng at hand ...
    state = rng.getstate()
    out = model.forward(ids)
    assert rng.getstate() == state and all(d.mask is None for d in layers)   # ... nothing is drawn
    assert out == plain.forward(ids) and not any(m.training for m in model.modules())
    G = [[0.1 * (t - j) for j in range(7)] for t in range(5)]
    model.zero_grad()
    plain.zero_grad()
    model.backward(G)
    plain.backward(G)
    assert [p.grad for p in model.params()] == [p.grad for p in plain.params()]


def _check_with_fixed_masks(model, loss, label):
    """Finite differences with dropout on: every loss evaluation draws the same masks (a fresh
    random.Random(7) per call), so the loss is a fixed smooth function; something must be dropped.
    eps = 1e-5: the kept entries' 1/(1-p) raises the curvature, and central differences' O(eps^2) error
    at 1e-4 reached 5e-4 relative on one entry (1e-5: 5e-6; the backward itself is exact)."""
    def f(backward):
        model.dropout_rng = random.Random(7)
        try:
            return loss(backward)
        finally:
            model.dropout_rng = None
    _check(f, model.params(), label, eps=1e-5)
    clean = loss(False)                                               # no rng: nothing dropped
    assert abs(f(False) - clean) > 1e-6, f"{label}: dropout changed nothing"
    assert model.dropout_rng is None


def t_grad_lm_with_dropout_fixed_masks():
    """Section 5.6 and eq. (6.4): with the masks fixed, the LM's backward (tied embedding, eq. 8.5) is the
    derivative of its dropped forward, every parameter against central differences."""
    lm = core.TransformerLM(6, 4, 2, 2, 6, pos="learned", max_len=6, tie_weights=True, seed=1, dropout=0.2)
    _check_with_fixed_masks(lm, lambda b: core.lm_loss(lm, [1, 3, 3, 5, 0, 2], backward=b), "LM dropout")


def t_grad_encoder_with_dropout_fixed_masks():
    """Section 5.6 and the MSE: a regression encoder with padding and RoPE, masks fixed."""
    enc = core.TransformerEncoder(6, 4, 2, 2, 6, n_out=2, pos="rope", pad_id=0, seed=4, dropout=0.2)
    _check_with_fixed_masks(enc, lambda b: core.regression_loss(enc, ([3, 1, 5, 0], [0.7, -1.2]), backward=b),
                            "encoder dropout")


def t_grad_encoder_decoder_with_dropout_fixed_masks():
    """Section 5.6, eqs. (2.11)-(2.16), (6.4): an EncoderDecoder with a padded source, masks fixed."""
    s2s = core.EncoderDecoder(6, 5, 4, 2, 1, 6, pos="sine", src_pad_id=0, seed=3, dropout=0.2)
    sample = ([2, 5, 3, 0], [1, 4, 2, 3, 1])
    _check_with_fixed_masks(s2s, lambda b: core.seq2seq_loss(s2s, sample, backward=b), "EncoderDecoder dropout")


def t_dropout_keeps_causality_and_hidden_keys_at_zero():
    """eq. (6.1) under dropout: the attention masks multiply A after the softmax, so a hidden (future or
    padded) key keeps weight 0 and logits at t never depend on tokens after t."""
    lm = core.TransformerLM(7, 8, 2, 2, 12, seed=2, dropout=0.3)
    ids = [1, 2, 3, 4, 5]
    outs = []
    for last in (5, 6):
        lm.dropout_rng = random.Random(11)
        outs.append(lm.forward(ids[:-1] + [last]))
        lm.dropout_rng = None
    assert outs[0][:-1] == outs[1][:-1] and outs[0][-1] != outs[1][-1]
    attn = lm.blocks[0].self_attn
    masks = [d.mask for d in attn.drop_heads]                        # M_h of each head, kept by its Dropout
    assert all(M is not None for M in masks) and any(0.0 in r for M in masks for r in M)
    for (_, _, _, A), M in zip(attn.heads, masks):
        assert all(a * m == 0.0 for t, (ra, rm) in enumerate(zip(A, M)) for a, m in zip(ra[t + 1:], rm[t + 1:]))


def _tiny_lm(**kw):
    return core.TransformerLM(6, 8, 2, 1, 12, pos="rope", seed=1, **kw)


def _weights_of(model):
    return [list(r) for p in model.params() for r in p.rows("data")]


def t_dropout_rate_zero_is_bit_identical_to_no_keyword():
    """dropout=0.0 is today's model: the same config (no 'dropout' key, so old files and checkpoints
    match), and a short training run gives the same losses and weights bit for bit."""
    data = _copy_task(10, random.Random(40))
    kw = dict(valid_data=data[:3], epochs=2, batch_size=4, lr=1e-2, warmup=2, workers=1, verbose=False)
    a, b = _tiny_lm(), _tiny_lm(dropout=0.0)
    assert a.config == b.config and "dropout" not in b.config
    ha, hb = core.train(a, data, core.lm_loss, **kw), core.train(b, data, core.lm_loss, **kw)
    assert [s["loss"] for s in ha["steps"]] == [s["loss"] for s in hb["steps"]]
    assert [e["valid_loss"] for e in ha["epochs"]] == [e["valid_loss"] for e in hb["epochs"]]
    assert _weights_of(a) == _weights_of(b)
    assert "loss_reduction" not in ha["settings"]


class _LossUntil:
    """lm_loss that raises KeyboardInterrupt on its ``at``-th call (Ctrl-C in the middle of a batch)."""

    def __init__(self, at):
        self.calls, self.at = 0, at
        self.__qualname__ = "lm_loss"                                   # the fingerprint names the loss

    def __call__(self, model, sample, backward=True):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return core.lm_loss(model, sample, backward=backward)


def t_training_with_dropout_is_reproducible_resumable_and_worker_independent():
    """Masks seeded by (seed, step, sample index): two runs are bit-identical, an interrupted run resumed
    from its checkpoint ends bit-identical to the uninterrupted one, and 2 workers draw the same masks as 1
    (weights equal up to the order of the gradient sums, < 1e-9, while dropout itself moves them > 1e-3)."""
    import contextlib
    import io
    data = _copy_task(12, random.Random(41))
    kw = dict(valid_data=data[:3], epochs=2, batch_size=4, lr=1e-2, warmup=2, seed=3, verbose=False)
    runs = []
    for workers in (1, 1, 2):
        m = _tiny_lm(dropout=0.3)
        h = core.train(m, data, core.lm_loss, workers=workers, **kw)
        assert m.dropout_rng is None
        runs.append((_weights_of(m), [s["loss"] for s in h["steps"]]))
    assert runs[0] == runs[1]
    flat = [[x for r in w for x in r] for w, _ in runs]
    assert max(abs(x - y) for x, y in zip(flat[0], flat[2])) < 1e-9
    plain = _tiny_lm()
    core.train(plain, data, core.lm_loss, workers=1, **kw)
    assert max(abs(x - y) for x, y in zip(flat[0], (x for r in _weights_of(plain) for x in r))) > 1e-3
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.json")
        with contextlib.redirect_stdout(io.StringIO()):
            _raises(KeyboardInterrupt, lambda: core.train(_tiny_lm(dropout=0.3), data, _LossUntil(15), workers=1,
                                                        checkpoint=ck, checkpoint_every=1e9, **kw))
        resumed = _tiny_lm(dropout=0.3)
        h = core.train(resumed, data, core.lm_loss, workers=1, checkpoint=ck, **kw)
        assert h["resumed_at_steps"] == [3]
        assert (_weights_of(resumed), [s["loss"] for s in h["steps"]]) == runs[0]


def t_apply_and_generate_never_drop():
    """Outside train nothing is dropped: forward, the cached decoding and generate give the same output
    twice and equal a rate-0 copy with the same weights."""
    drop, plain = _tiny_lm(dropout=0.5), _tiny_lm()
    core.train(drop, _copy_task(8, random.Random(42)), core.lm_loss, epochs=1, batch_size=4, workers=1, verbose=False)
    for p, q in zip(plain.params(), drop.params()):
        p.data = [list(r) for r in q.data] if isinstance(q.data[0], list) else list(q.data)
    ids = [2, 3, 4, 5]
    assert drop.forward(ids) == drop.forward(ids) == plain.forward(ids)
    for fn in (lambda m: core.greedy_decode(m, [2, 3], 5),
               lambda m: core.sample(m, [2, 3], 5, rng=random.Random(1)),
               lambda m: core.generate_plain(m, [2, 3], 5, lambda row, allowed: row.index(max(row))),
               lambda m: core.beam_search(m, [2, 3], 2, 4)):
        assert fn(drop) == fn(drop) == fn(plain)


def t_dropout_rate_is_saved_and_old_files_load_with_zero():
    """Persistence: a non-zero rate is in the saved config and comes back; a file without it (written before
    dropout existed) loads with rate 0; a rate outside [0, 1) in a file is a ModelFormatError naming it."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.json")
        for rate, model in ((0.1, core.TransformerLM(7, 8, 2, 1, 12, seed=3, dropout=0.1)),
                            (0.2, core.TransformerEncoder(7, 8, 2, 1, 12, seed=4, dropout=0.2)),
                            (0.3, core.EncoderDecoder(7, 5, 8, 2, 1, 12, seed=5, dropout=0.3))):
            core.save_model(model, path)
            again = core.load_model(path)
            assert again.config == model.config
            assert {d.p for d in _dropout_layers(again)} == {d.p for d in _dropout_layers(model)} == {rate}
        core.save_model(core.TransformerLM(7, 8, 2, 1, 12, seed=3), path)
        assert "dropout" not in json.load(open(path))["config"]
        assert {d.p for d in _dropout_layers(core.load_model(path))} == {0.0}
        obj = json.load(open(path))
        obj["config"]["dropout"] = 1.0
        with open(path, "w") as f:
            json.dump(obj, f)
        assert "dropout is 1.0" in str(_raises(core.ModelFormatError, lambda: core.load_model(path)))


def t_per_token_loss_sum_and_its_gradient():
    """eq. (6.4) summed instead of averaged: lm_loss / seq2seq_loss with reduction="sum" return (sum over
    the counted tokens, their number), sum = mean * count, and the backward is the gradient of the sum."""
    lm = core.TransformerLM(6, 4, 2, 1, 6, pos="rope", seed=2)
    sample = ([0, 4, 1, 2], [4, -100, 2, 3])
    total, n = core.lm_loss(lm, sample, backward=False, reduction="sum")
    assert n == 3 and abs(total - 3 * core.lm_loss(lm, sample, backward=False)) < 1e-12
    _check(lambda b: core.lm_loss(lm, sample, backward=b, reduction="sum")[0], lm.params(), "LM sum")
    s2s = core.EncoderDecoder(6, 5, 4, 2, 1, 6, seed=3)
    pair = ([2, 5, 3], [1, 4, 2, 3])
    total, n = core.seq2seq_loss(s2s, pair, backward=False, reduction="sum")
    assert n == 3 and abs(total - 3 * core.seq2seq_loss(s2s, pair, backward=False)) < 1e-12
    _check(lambda b: core.seq2seq_loss(s2s, pair, backward=b, reduction="sum")[0], s2s.params(), "seq2seq sum")
    assert "'max'" in str(_raises(ValueError, lambda: core.cross_entropy_rows([[0.0]], [0], reduction="max")))


def t_train_per_token_loss_is_the_batch_token_mean():
    """loss_reduction="token": one step is the gradient of (sum of the batch's token losses) / (its counted
    tokens), clipped, then Adam, written out by hand; the step and validation losses are token means; the
    setting is recorded only when not the default."""
    data = [[1, 2, 3, 4, 5, 2, 3], [2, 3], [4, 5, 1, 2]]                     # 6, 1 and 3 target tokens
    a, b = _tiny_lm(), _tiny_lm()
    h = core.train(a, data, core.lm_loss, valid_data=data, epochs=1, batch_size=3, lr=0.05, warmup=1, clip=0.01,
                 workers=1, verbose=False, loss_reduction="token")
    assert h["settings"]["loss_reduction"] == "token"
    b.zero_grad()
    sums = [core.lm_loss(b, s, reduction="sum")[0] for s in data]
    means = [core.lm_loss(b, s, backward=False) for s in data]
    assert abs(h["steps"][0]["loss"] - sum(sums) / 10) < 1e-12
    assert abs(h["steps"][0]["loss"] - sum(means) / 3) > 1e-3                # not the per-sample mean
    for p in b.params():
        for r in p.rows("grad"):
            r[:] = [x / 10 for x in r]
    norm, coef = core.clip_grad_norm(b.params(), 0.01)
    assert coef < 1.0 and abs(norm - h["steps"][0]["grad_norm"]) < 1e-12
    core.Adam(b.params(), lr=0.05).step()
    diff = max(abs(x - y) for r, s in zip(_weights_of(a), _weights_of(b)) for x, y in zip(r, s))
    assert diff < 1e-12, diff
    valid = sum(core.lm_loss(a, s, backward=False, reduction="sum")[0] for s in data) / 10
    assert abs(h["epochs"][0]["valid_loss"] - valid) < 1e-12
    e = _raises(TypeError, lambda: core.train(core.TransformerEncoder(6, 4, 2, 1, 6), [([1, 2], 0.5)],
                                            core.regression_loss, loss_reduction="token", verbose=False))
    assert "regression_loss" in str(e)
    assert "'tokens'" in str(_raises(ValueError, lambda: core.train(_tiny_lm(), data, core.lm_loss,
                                                                   loss_reduction="tokens", verbose=False)))


def t_per_token_loss_with_two_workers_matches_one():
    """loss_reduction="token" with 2 workers: the token counts of the shares add up; same run as 1 worker."""
    data = _copy_task(6, random.Random(43)) + [[2, 3], [4, 5, 2]]
    out = []
    for workers in (1, 2):
        m = _tiny_lm(dropout=0.2)
        h = core.train(m, data, core.lm_loss, epochs=2, batch_size=4, workers=workers, verbose=False,
                     loss_reduction="token", valid_data=data)
        out.append(([x for r in _weights_of(m) for x in r], [e["valid_loss"] for e in h["epochs"]]))
    assert max(abs(x - y) for x, y in zip(out[0][0], out[1][0])) < 1e-9
    assert max(abs(x - y) for x, y in zip(out[0][1], out[1][1])) < 1e-12


# ----------------------------------------------------------------------------- the layout of transformer.py

# A tutorial number: an equation '(x.y)', 'eq. x.y' or 'eqs. x.y'; a section 'section x.y' or '§x.y'; a chapter '§x'.
_CITATION = re.compile(r"\((\d+)\.(\d+)\)|\beqs?\.\s*(\d+)\.(\d+)|\bsection\s+(\d+)\.(\d+)|§(\d+)(?:\.(\d+))?")


def _banners(lines, rule):
    """[(line number of its first line, title, header block)] for every banner of ``lines``: a line that
    starts with ``rule``, the title line, a second ``rule`` line.  The header block is the banner with the
    comment lines right after it, up to the first line that is not a comment."""
    out = []
    for i in range(len(lines) - 2):
        if lines[i].startswith(rule) and lines[i + 2].startswith(rule) and not lines[i + 1].startswith(rule):
            j = i + 3
            while j < len(lines) and lines[j].startswith("#"):
                j += 1
            out.append((i + 1, lines[i + 1][2:].strip(), "\n".join(lines[i:j])))
    return out


def _citation_order_problems(sections):
    """The tutorial numbers cited in the header blocks of ``sections`` (as ``_banners`` returns them), in
    reading order, that go down: an equation or section (x, y) below the (chapter, number) pair before
    it, or a chapter §x below the chapter reached.  [] when they never go down."""
    last, problems = (0, 0), []
    for line, title, block in sections:
        for m in _CITATION.finditer(block):
            g = m.groups()
            x, y = next((g[k], g[k + 1]) for k in (0, 2, 4, 6) if g[k] is not None)
            if y is None:                                              # a chapter: compared by chapter only
                ok, now = int(x) >= last[0], (int(x), last[1] if int(x) == last[0] else 0)
            else:
                ok, now = (int(x), int(y)) >= last, (int(x), int(y))
            if not ok:
                problems.append(f"line {line} ({title}): {m.group(0)} after {last[0]}.{last[1]}")
            last = max(last, now)
    return problems


def _layout_problems(path):
    """What is wrong with the layout of the transformer.py at ``path`` (see t_transformer_py_reads_in_the_
    tutorials_order); [] when nothing is."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    part2 = [(line, block) for line, title, block in _banners(lines, "# ####") if title.startswith("PART II")]
    problems = [] if part2 else ["no Part II banner ('# ####...', '# PART II: ...', '# ####...')"]
    end = part2[0][0] if part2 else len(lines)                         # Part I: from the top to Part II's banner
    part1 = [s for s in _banners(lines, "# ====") if s[0] < end]
    problems += _citation_order_problems(part1)
    titles = [t.lower() for _, t, _ in part1]
    order = ["ops", "attention", "positions", "layers", "models", "losses", "optimisation", "schedules",
             "training", "generation", "gradient checking", "counting"]
    found = [next((i for i, t in enumerate(titles) if word in t), None) for word in order]
    if None in found or found != sorted(found):
        problems.append(f"Part I's sections are not in the order {order}: {titles}")
    problems += [f"the section {t!r} does not name its tutorial chapter ('§x' in its title, or 'chapter x')"
                 for _, t, block in part1 if not re.search(r"§\d", t) and not re.search(r"\bchapter \d", block)]
    gen = next((line for line, t, _ in part1 if "generation" in t.lower()), None)
    if gen is None or gen > 1750:
        problems.append(f"the generation section starts at line {gen}, not within 1,750 lines")
    if part2 and part1[-1][1] != "Counting":
        problems.append(f"Part II's banner comes after {part1[-1][1]!r}, not after generation and counting")
    if part2 and "may skip" not in " ".join(ln.lstrip("# ") for ln in part2[0][1].split("\n")):
        problems.append("Part II's banner does not tell a learner that they may skip it")
    return problems + _toc_problems(text, _banners(lines, "# ===="))


def _toc_problems(text, sections):
    """The table of contents in the module docstring (from its line '  Part I:' on, the lines of four
    spaces, a name, two spaces or more, what is there) must list the sections' titles in the file's order:
    each name's first two words begin the title of the section in the same place."""
    doc = text.split('"""')[1].split("\n  Part I:")[-1]
    names = [m.group(1) for m in re.finditer(r"^    (\S.*?)\s{2,}", doc, re.M)]
    def words(s):
        return re.findall(r"[§\w]+", s.lower())
    titles = [t for _, t, _ in sections]
    if len(names) != len(titles) or any(words(n)[:2] != words(t)[:len(words(n)[:2])] for n, t in zip(names, titles)):
        return [f"the table of contents {names} does not list the sections {titles}"]
    return []


def t_transformer_py_reads_in_the_tutorials_order():
    """The layout of transformer.py.  Part I, the tutorial, runs from the top of the file to the
    Part II banner (a '# ####' line, '# PART II: ...', a '# ####' line).  (a) The tutorial numbers cited in
    Part I's section header blocks never go down.  A section header block is a section banner (a '# ===='
    line, the title, a '# ====' line) with the comment lines right after it, up to the first line that is not
    a comment; docstrings do not count.  The numbers read there are equations '(x.y)', 'eq. x.y', 'eqs. x.y'
    and sections 'section x.y', '§x.y', each a (chapter, number) pair that must not be below the pair
    before it, and chapters '§x', which must not be below the chapter reached.  Part I's sections come in
    the order ops, attention, positions, layers, models, losses, optimisation, schedules, training,
    generation, gradient checking, counting; each names its tutorial chapter, in its title ('§2 Attention')
    or, for the last three, which come after the recipe although the tutorial treats them earlier, in words
    ('chapter 6'), outside the rising order.  (b) The generation section's banner starts by line 1,750.
    (c) The Part II banner exists, comes right after counting (so after generation), and says that a
    learner may skip Part II; the module docstring's table of contents lists the sections in the file's
    order.  Check (a) must fail on Part I with §4 positions put back before §2 attention (the old order)."""
    assert _layout_problems(core.__file__) == []
    with open(core.__file__, encoding="utf-8") as f:
        lines = f.read().split("\n")
    sections = _banners(lines, "# ====")
    titles = [t for _, t, _ in sections]
    attn, pos = titles.index("§2 Attention"), titles.index("§4 Positions")
    old_order = sections[:attn] + [sections[pos]] + sections[attn:pos] + sections[pos + 1:]
    assert _citation_order_problems(old_order)                         # positions before attention: caught


# ----------------------------------------------------------------------------- runner


def main(namespace=None, argv=None):
    """Run every ``t_*`` function in ``namespace`` (default: this module) in definition order.

    Prints one line per test and a final line ``N passed, N failed``; returns 1 if any failed.
    A test that raises unittest.SkipTest is reported as skipped (pytest does the same).
    Optional argv: substrings; only tests whose name contains one of them run.  ``-h``/``--help`` prints
    the module docstring and this usage and returns 0 without running anything; any other option (an
    argument starting with ``-``) or a name that matches no test is a usage error: returns 2.
    """
    namespace = globals() if namespace is None else namespace
    argv = sys.argv[1:] if argv is None else argv
    script = os.path.basename(namespace.get("__file__") or __file__)
    usage = f"usage: python {script} [-h] [NAME ...]   (run the t_* tests whose name contains a NAME)"
    if "-h" in argv or "--help" in argv:
        print(f"{usage}\n\n{namespace.get('__doc__') or ''}")
        return 0
    options = [a for a in argv if a.startswith("-")]
    if options:
        print(f"{usage}\nerror: unknown option(s) {' '.join(options)}", file=sys.stderr)
        return 2
    tests = [(k, v) for k, v in namespace.items() if k.startswith("t_") and callable(v)]
    if argv:
        tests = [(k, v) for k, v in tests if any(a in k for a in argv)]
        if not tests:
            print(f"{usage}\nerror: no test name contains any of {argv}", file=sys.stderr)
            return 2
    passed = failed = skipped = 0
    t_all = time.perf_counter()
    for name, fn in tests:
        t0 = time.perf_counter()
        try:
            fn()
        except unittest.SkipTest as e:
            skipped += 1
            print(f"skip  {name}: {e}")
            continue
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n" + "".join("      " + ln for ln in traceback.format_exc().splitlines(True)))
            continue
        passed += 1
        print(f"ok    {name} ({1000 * (time.perf_counter() - t0):.0f} ms)")
    print(f"{len(tests)} tests in {time.perf_counter() - t_all:.2f} s on Python {sys.version.split()[0]}"
          + (f"; {skipped} skipped" if skipped else ""))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
