"""A Transformer written out by hand in pure Python, for chemists who want to read every line.

Matrices are ``list[list[float]]`` (rows), vectors ``list[float]``; one sequence per forward pass.
Every layer has a ``forward`` that caches what its ``backward`` needs; ``backward(dout)`` returns the
gradient with respect to the layer's input and ADDS parameter gradients into ``Param.grad``.
A batch is gradient accumulation over samples followed by one optimizer step.

Dimension names used in the shape comments:
    T    length of the sequence being processed (target side)
    S    length of the sequence attended to (source / keys; S = T for self-attention)
    d    model width             H    number of heads          d_h = d / H
    d_ff feed-forward width      V    vocabulary size           L    number of layers

Equation numbers ``eq. (x.y)`` refer to the tutorial this library accompanies; section ``§x`` is its
chapter x.  The file has two parts.  Part I is the tutorial, read top to bottom in the tutorial's order
(each section's banner names its chapter, and the equations the banners cite never go down):

  Part I: the tutorial
    §2 ops                   matmul and its transposed forms, softmax (2.3) and its backward (2.5)
    §2 attention             Param, Module (training and inference modes), Linear (2.15), attention_mask
                             (causal, padding), MultiHeadAttention (2.11)-(2.16) with a head_mask option
    §4 positions             sine/cosine table (4.4), RoPE (4.7)
    §5 layers and blocks     FeedForward (5.1) with GELU (5.2), Pre-LN EncoderBlock / DecoderBlock (5.4),
                             Dropout (section 5.6), LayerNorm (5.7)/(5.11), Xavier (5.13), Embedding
    §6 models                TokenPositionEmbedding, TransformerEncoder, TransformerLM (causal, 6.1),
                             EncoderDecoder
    §6 losses                cross_entropy_rows (6.4), mse_loss, per-sample task losses
    §7 optimisation          Adam (7.7)/(7.8)
    §8 schedules, clipping   warmup_inv_sqrt_lr and noam_lr (8.1), clip_grad_norm (8.3); the tied head (8.5)
    §8 training              train(): the recipe (batch, forward, loss, backward, clip, step, schedule) and
                             its bookkeeping (_TrainingRun: position, history, progress, checkpoints)
    generation               generate_plain (the plain loop: a full forward per token), then the same
                             cached (DecodeState, K/V cache); generate / greedy_decode / sample with
                             temperature, top-k, constraints and backtracking; log_softmax,
                             sequence_logprob, beam search
    gradient checking        numerical_grad, grad_ok, gradient_check
    counting                 param_count, param_count_formula

  Part II: the plumbing (what train and the library need around the recipe; a learner may skip it)
    guards                   train's argument and sample checks, non-finite steps, SIGTERM as Ctrl-C
    checkpoints              save, fingerprint, the checks before a resume
    data parallelism         forked workers for train's batches (_Serial, _DataParallel), parallel_map
    model files              save_model / load_model (atomic JSON), set_weights, ModelFormatError

Standard library only.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import random
import sys
import time
import traceback
from array import array
from operator import add, mul

from safe_io import atomic_write  # the project's one safe, atomic file writer (standard library only)

__all__ = [
    # ops
    "dot", "DOT_IMPL", "matmul", "matmul_nt", "matmul_tn", "transpose", "scale_mat", "add_mat",
    "add_inplace", "zeros", "softmax_rows", "softmax_backward", "gelu", "gelu_grad", "xavier_std",
    "ShapeError",
    # positions
    "POS_SCHEMES", "sine_cosine_table", "rope_rotate", "rope_rotate_inverse", "rope_rows",
    # layers and models
    "Param", "Module", "Linear", "Embedding", "LayerNorm", "Dropout", "FeedForward", "attention_mask", "padding_mask",
    "MultiHeadAttention",
    "EncoderBlock", "DecoderBlock", "TokenPositionEmbedding", "TransformerEncoder", "TransformerLM",
    "EncoderDecoder",
    # losses
    "cross_entropy_rows", "mse_loss", "lm_loss", "seq2seq_loss", "regression_loss",
    # optimisation and training
    "Adam", "grad_norm", "clip_grad_norm", "noam_lr", "warmup_inv_sqrt_lr", "train", "default_workers",
    "parallel_map", "keyed_rng", "CheckpointMismatchError", "NonFiniteLossError", "sigterm_as_ctrl_c", "format_time",
    # generation, checking, counting, persistence
    "generate_plain", "DecodeState", "start_decode", "generate", "greedy_decode", "sample",
    "log_softmax", "sequence_logprob", "beam_search", "Hypothesis", "ConstraintError", "numerical_grad", "grad_ok",
    "gradient_check",
    "param_count", "param_count_formula", "save_model", "load_model", "set_weights", "ModelFormatError",
    "check_model_config",
]


# #####################################################################################
# PART I: THE TUTORIAL
# #####################################################################################
# The Transformer in the tutorial's order, from the arithmetic to generation.  Every section starts with a
# banner naming its tutorial chapter (§) and the equations it implements; Part II holds the plumbing.

# =====================================================================================
# §2 Ops
# =====================================================================================
# The arithmetic every layer is written in, on lists of rows: inner products, the matrix products
# (matmul_nt is the one kernel they all go through), and the row-wise softmax of eq. (2.3) with its
# backward, eq. (2.5), a Jacobian-vector product in O(n) per row.

_sumprod = getattr(math, "sumprod", None)  # Python 3.12+: the inner product in one C call

if _sumprod is not None:
    DOT_IMPL = "math.sumprod"
    dot = _sumprod
else:
    DOT_IMPL = "sum(map(mul))"

    def dot(a, b):
        """Inner product <a, b> through the C-level iterators."""
        return sum(map(mul, a, b))


class ShapeError(ValueError):
    """Raised when a module receives an input of the wrong shape; the message names both shapes."""


def shape_of(X):
    """Shape of a matrix (rows, cols) or a vector (n,) as a tuple, for error messages."""
    if X and isinstance(X[0], (list, tuple)):
        return (len(X), len(X[0]))
    return (len(X),)


def _check_matrix(X, cols, who):
    """Raise ShapeError unless X is a non-empty list of rows with ``cols`` entries each."""
    if not X:
        raise ShapeError(f"{who}: got an empty input (0 rows); expected shape (T, {cols}) with T >= 1")
    for r in X:
        if len(r) != cols:
            raise ShapeError(f"{who}: input has shape ({len(X)}, {len(r)}), expected ({len(X)}, {cols})")


def zeros(n, m=None):
    """An n x m matrix of zeros, or a vector of n zeros when m is None."""
    if m is None:
        return [0.0] * n
    return [[0.0] * m for _ in range(n)]


def zeros_like(X):
    """Zeros with the shape of the vector or matrix X."""
    if X and isinstance(X[0], list):
        return [[0.0] * len(r) for r in X]
    return [0.0] * len(X)


def transpose(A):
    """A^T as a list of lists."""
    return [list(col) for col in zip(*A)]


def matmul_nt(A, B):
    """C = A B^T for A (n, k), B (m, k): C[i][j] = <A[i], B[j]>, the rows of B being the columns we need.

    The one kernel every product in this module goes through: matmul, matmul_tn, Linear, and Q K^T and
    A V in attention."""
    if A and B and len(A[0]) != len(B[0]):
        raise ShapeError(f"matmul_nt: shapes {shape_of(A)} and {shape_of(B)} do not align")
    if _sumprod is not None:
        return [[_sumprod(a, b) for b in B] for a in A]
    return [[sum(map(mul, a, b)) for b in B] for a in A]


def matmul(A, B):
    """C = A B for A (n, k), B (k, m): transpose B once, then ``matmul_nt``."""
    if A and len(A[0]) != len(B):
        raise ShapeError(f"matmul: shapes {shape_of(A)} and {shape_of(B)} do not align")
    return matmul_nt(A, list(zip(*B)))


def matmul_tn(A, B):
    """C = A^T B for A (k, n), B (k, m); the weight gradient X^T dY of eq. (2.15)."""
    if len(A) != len(B):
        raise ShapeError(f"matmul_tn: shapes {shape_of(A)} and {shape_of(B)} do not align")
    return matmul_nt(list(zip(*A)), list(zip(*B)))


def scale_mat(A, s):
    """s * A."""
    return [[x * s for x in r] for r in A]


def add_mat(A, B):
    """A + B elementwise (same shapes)."""
    return [list(map(add, a, b)) for a, b in zip(A, B)]


def add_inplace(A, B):
    """A += B elementwise, in place (matrices or vectors); used to accumulate gradients."""
    if A and isinstance(A[0], list):
        for a, b in zip(A, B):
            a[:] = map(add, a, b)
    else:
        A[:] = map(add, A, B)


def softmax_rows(S):
    """Row-wise softmax, max-subtracted for stability, eq. (2.3).

    A row that is entirely -inf (every key masked) gives all zeros instead of NaN.
    """
    exp = math.exp
    out = []
    for row in S:
        m = max(row)
        if m == -math.inf:
            out.append([0.0] * len(row))
            continue
        e = [exp(x - m) for x in row]
        inv = 1.0 / sum(e)
        out.append([x * inv for x in e])
    return out


def softmax_backward(A, dA):
    """Softmax Jacobian-vector product, eq. (2.5): dS = a * (da - <da, a>) per row, O(n) per row."""
    out = []
    for a, da in zip(A, dA):
        c = dot(a, da)
        out.append([ai * (gi - c) for ai, gi in zip(a, da)])
    return out


# =====================================================================================
# §2 Attention
# =====================================================================================
# Scaled dot-product attention with H heads, eqs. (2.11)-(2.16), and what it is built from: Param (a
# tensor and its gradient), Module (the base of every layer: parameters, and the training and inference
# modes that switch dropout on and off), Linear (Y = X W + b, whose weight gradient is X^T dY), the
# additive masks (attention_mask: causal and key padding) and MultiHeadAttention itself, whose backward
# differentiates its forward line by line.


class Param:
    """A trainable tensor: ``data`` (vector or matrix), ``grad`` of the same shape, and a ``name``."""

    __slots__ = ("data", "grad", "name")

    def __init__(self, data, name=""):
        self.data = data
        self.grad = zeros_like(data)
        self.name = name

    @property
    def shape(self):
        return shape_of(self.data)

    def size(self):
        """Number of scalar entries."""
        if self.data and isinstance(self.data[0], list):
            return len(self.data) * len(self.data[0])
        return len(self.data)

    def rows(self, which="data"):
        """The tensor as a list of rows (a vector is one row); rows are the live lists, not copies."""
        t = getattr(self, which)
        return t if t and isinstance(t[0], list) else [t]

    def zero_grad(self):
        self.grad = zeros_like(self.data)

    def __repr__(self):
        return f"Param({self.name!r}, shape={self.shape})"


class Module:
    """Base class: ``params()`` lists the trainable tensors; ``forward``/``backward`` are per layer.

    Two modes, as in torch: ``train(rng)`` puts a module and every module inside it in training mode, where
    its Dropout layers (§5) drop, drawing their masks from ``rng`` in the order of the forward pass;
    ``eval()`` puts them back in inference mode (the default), where Dropout is the identity.  ``train``
    (§8) switches a model to training mode for each batch's samples and back to inference mode after."""

    name = "module"
    training = False

    def params(self):
        return []

    def zero_grad(self):
        for p in self.params():
            p.zero_grad()

    def named_params(self):
        """Dict name -> Param (names are unique within a model)."""
        return {p.name: p for p in self.params()}

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def modules(self):
        """This module and every module inside it (attributes holding a Module or a list of them), depth first."""
        found = [self]
        for v in vars(self).values():
            if isinstance(v, Module):
                found += v.modules()
            elif isinstance(v, list) and v and isinstance(v[0], Module):
                for m in v:
                    found += m.modules()
        return found

    def train(self, rng=None):
        """Training mode: every Dropout inside drops, all of them drawing from ``rng`` (a random.Random)."""
        return self._set_mode(True, rng)

    def eval(self):
        """Inference mode: every Dropout inside is the identity and draws nothing."""
        return self._set_mode(False, None)

    def _set_mode(self, training, rng):
        for m in self.modules():
            m.training = training
            if isinstance(m, Dropout):
                m.rng = rng
        return self

    @property
    def dropout_rng(self):
        """The random.Random the Dropout layers inside draw from (None in inference mode).  Setting an rng is
        ``train(rng)``; setting None is ``eval()``."""
        return next((m.rng for m in self.modules() if isinstance(m, Dropout)), None)

    @dropout_rng.setter
    def dropout_rng(self, rng):
        self._set_mode(rng is not None, rng)


class Linear(Module):
    """Affine map Y = X W + b with W (d_in, d_out), Xavier init; backward dW = X^T dY, eq. (2.15)."""

    def __init__(self, d_in, d_out, bias=True, rng=None, std=None, name="linear"):
        rng = rng or random.Random(0)
        std = xavier_std(d_in, d_out) if std is None else std
        self.d_in, self.d_out, self.name = d_in, d_out, name
        self.W = Param([[rng.gauss(0.0, std) for _ in range(d_out)] for _ in range(d_in)], name + ".W")
        self.b = Param([0.0] * d_out, name + ".b") if bias else None

    def params(self):
        return [self.W, self.b] if self.b is not None else [self.W]

    def forward(self, X):                                    # X (T, d_in)
        _check_matrix(X, self.d_in, f"Linear '{self.name}'")
        self.X = X                                           # cached for backward
        return self.apply(X)

    def apply(self, X):
        """Y = X W + b without caching anything (the inference path)."""
        Y = matmul(X, self.W.data)                           # (T, d_out) = X W
        if self.b is not None:
            b = self.b.data
            Y = [list(map(add, y, b)) for y in Y]           # + b
        return Y

    def backward(self, dY):                                  # dY (T, d_out)
        if len(dY) != len(self.X):
            raise ShapeError(f"Linear '{self.name}'.backward: dY has {len(dY)} rows, forward had {len(self.X)}")
        _check_matrix(dY, self.d_out, f"Linear '{self.name}'.backward")
        add_inplace(self.W.grad, matmul_tn(self.X, dY))     # dW += X^T dY        (d_in, d_out)
        if self.b is not None:
            add_inplace(self.b.grad, [sum(c) for c in zip(*dY)])  # db += sum_t dY[t]
        return matmul_nt(dY, self.W.data)                   # dX = dY W^T         (T, d_in)


_CAUSAL_CACHE = {}


def attention_mask(T, S, causal=False, key_padding_mask=None):
    """The additive mask (T, S) that attention adds to its scores: 0 where query t may see key j, -inf
    where it may not; None when it hides nothing.  Every attention path builds its mask here.

    ``causal`` (eq. 6.1): the T queries are the last T of the S positions (query t sits at position
    S - T + t; T = S in training, T < S when new rows extend a K/V cache) and see the keys j <= S - T + t.
    ``key_padding_mask`` (S booleans, True = pad) hides the padded keys from every query.
    """
    if causal and T > S:
        raise ShapeError(f"attention_mask: a causal mask needs T <= S queries, got T={T}, S={S}")
    mask = None
    if causal and T > 1:                        # one newest query sees every key: nothing to hide
        full = _CAUSAL_CACHE.get(S)
        if full is None:
            full = _CAUSAL_CACHE[S] = [[0.0] * (t + 1) + [-math.inf] * (S - t - 1) for t in range(S)]
        mask = full if T == S else full[S - T:]
    if key_padding_mask is not None:
        if len(key_padding_mask) != S:
            raise ShapeError(f"attention_mask: key_padding_mask has length {len(key_padding_mask)}, "
                             f"keys have length {S}")
        pad_row = [-math.inf if p else 0.0 for p in key_padding_mask]      # (S,)
        mask = [pad_row] * T if mask is None else [list(map(add, m, pad_row)) for m in mask]
    return mask


def padding_mask(ids, pad_id):
    """The key_padding_mask of a sequence: True where ids[t] == pad_id; None if pad_id is None or no id is."""
    if pad_id is None:
        return None
    mask = [i == pad_id for i in ids]
    return mask if any(mask) else None


def _concat_heads(per_head):
    """[M_1 .. M_H]: the heads' (n, d_h) matrices side by side, (n, H d_h)."""
    out = [[] for _ in per_head[0]]
    for M in per_head:
        for o, r in zip(out, M):
            o.extend(r)
    return out


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention, eqs. (2.11)-(2.16).

    Self-attention: one batched projection [Q K V] = X W_qkv (T, 3d), split into H heads of width d_h.
    Cross-attention (``cross=True``): Q = X W_q from the decoder, [K V] = M W_kv from the encoder memory M.
    Per head: S_h = Q_h K_h^T / sqrt(d_h) + mask, A_h = softmax(S_h), O_h = A_h V_h; the heads are
    concatenated and projected, Y = [O_1 .. O_H] W_o + b_o.  RoPE (``rope=True``) rotates Q_h and K_h
    (never V) by position.  Masks (``attention_mask``): ``causal=True`` hides keys j > t (eq. 6.1);
    ``key_padding_mask`` (length S, True = pad) hides padded keys.  A query whose keys are all hidden
    gets a zero output, never NaN.

    ``head_mask``: None (default) or H factors c_h, usually 0 or 1; every path then uses c_h O_h in place
    of O_h before W_o, so c_h = 0 ablates head h (backward differentiates the forward's factors).
    After a training ``forward``, ``heads[h]`` is (Q_h, K_h, V_h, A_h) of head h (A_h: (T, S), K_h after
    RoPE) and ``_Ads[h]`` the weights after dropout, what ``backward`` reads.

    ``dropout=p``: in training mode ``forward`` drops the attention weights after the softmax, O_h =
    (A_h * M_h) V_h (section 5.6), through ``drop_heads[h]``, one Dropout layer per head, which keeps M_h
    for ``backward``; a hidden key has A_h = 0 and stays 0.

    Reading order: ``forward`` and the helpers it calls (``_project``: the projections, split into heads by
    ``_split``; ``_attend``: scores, mask, softmax, A V), then ``backward``, then ``apply`` (forward without
    caches).  Decoding (Generation, below): ``new_cache``/``extend`` (causal self-attention over a K/V cache),
    ``memory_kv``/``attend_memory`` (cross-attention to a fixed memory).  Every path attends in ``_attend``.
    """

    def __init__(self, d, n_heads, rng=None, causal=False, rope=False, cross=False, out_scale=1.0,
                 name="attn", dropout=0.0):
        if d % n_heads:
            raise ValueError(f"MultiHeadAttention '{name}': d={d} is not divisible by n_heads={n_heads}")
        rng = rng or random.Random(0)
        self.d, self.H, self.d_h = d, n_heads, d // n_heads
        if rope and self.d_h % 2:
            raise ValueError(f"MultiHeadAttention '{name}': RoPE needs an even head width, got d_h={self.d_h}")
        if rope and cross:
            raise ValueError(f"MultiHeadAttention '{name}': RoPE is for self-attention only")
        self.causal, self.rope, self.cross, self.name = causal, rope, cross, name
        self.scale = 1.0 / math.sqrt(self.d_h)
        self.head_mask = None
        if cross:
            self.q = Linear(d, d, rng=rng, name=name + ".q")
            self.kv = Linear(d, 2 * d, rng=rng, name=name + ".kv")
        else:
            self.qkv = Linear(d, 3 * d, rng=rng, name=name + ".qkv")
        self.o = Linear(d, d, rng=rng, std=xavier_std(d, d) * out_scale, name=name + ".o")
        self.drop_heads = [Dropout(dropout, name=f"{name}.drop{h}") for h in range(n_heads)]   # A_h * M_h

    def params(self):
        proj = self.q.params() + self.kv.params() if self.cross else self.qkv.params()
        return proj + self.o.params()

    # --- the training forward, then the helpers it calls in that order --------------------------------

    def forward(self, X, memory=None, key_padding_mask=None):   # X (T, d); memory (S, d) if cross
        """Y = [O_1 .. O_H] W_o + b_o, O_h = softmax(Q_h K_h^T / sqrt(d_h) + mask) V_h; keeps what backward
        reads."""
        Qs, Ks, Vs = self._project(X, memory, train=True)          # per head Q_h (T, d_h), K_h, V_h (S, d_h)
        T, S = len(X), len(Ks[0])
        mask = attention_mask(T, S, self.causal, key_padding_mask)  # (T, S) or None
        VTs = [list(zip(*Vh)) for Vh in Vs]
        O, As, self._Ads = self._attend(Qs, Ks, VTs, mask, self.drop_heads)   # O = [c_h (A_h * M_h) V_h]
        self.heads, self._head_mask = list(zip(Qs, Ks, Vs, As)), self.head_mask    # for backward
        return self.o.forward(O)                                    # Y = O W_o + b_o   (T, d)

    def _project(self, X, memory, train):
        """The projections, split into heads: lists of Q_h (T, d_h), K_h and V_h (S, d_h); Q_h, K_h rotated
        with RoPE.  ``train`` runs the Linear layers' ``forward`` (caching for backward), else ``apply``."""
        d = self.d
        if self.cross:
            if memory is None:
                raise ValueError(f"MultiHeadAttention '{self.name}': cross-attention needs memory")
            Q = (self.q.forward if train else self.q.apply)(X)      # Q = X W_q        (T, d)
            KV = (self.kv.forward if train else self.kv.apply)(memory)   # [K V] = M W_kv   (S, 2d)
            Qs, Ks, Vs = self._split(Q, 0), self._split(KV, 0), self._split(KV, d)
        else:
            QKV = (self.qkv.forward if train else self.qkv.apply)(X)     # [Q K V] = X W_qkv  (T, 3d)
            Qs, Ks, Vs = self._split(QKV, 0), self._split(QKV, d), self._split(QKV, 2 * d)
        if self.rope:                                               # rotate Q and K, never V
            Qs, Ks = [rope_rows(Qh) for Qh in Qs], [rope_rows(Kh) for Kh in Ks]
        return Qs, Ks, Vs

    def _split(self, M, at):
        """The H column blocks of width d_h of M that start at column ``at`` (the heads of Q, K or V)."""
        d_h = self.d_h
        return [[r[at + h * d_h:at + (h + 1) * d_h] for r in M] for h in range(self.H)]

    def _attend(self, Qs, Ks, VTs, mask, drops=None):
        """Scaled dot-product attention of every head, the arithmetic all paths share: per head
        S_h = Q_h K_h^T / sqrt(d_h) + mask, A_h = softmax(S_h) (eq. 2.3), O_h = A_h V_h, times head_mask[h].
        Takes per head Q_h (T, d_h), K_h (S, d_h) and V_h^T (d_h, S), and the (T, S) mask or None;
        ``drops``: per head a Dropout layer (``forward`` passes ``drop_heads``), then O_h = (A_h * M_h) V_h.
        Returns O = [O_1 .. O_H] (T, d), the A_h, and the A_h * M_h (each A_h itself when nothing dropped)."""
        scale, hm = self.scale, self.head_mask
        if hm is not None and len(hm) != self.H:
            raise ShapeError(f"MultiHeadAttention '{self.name}': head_mask has {len(hm)} factors for {self.H} heads")
        Os, As, Ads = [], [], []
        for h, (Qh, Kh, VhT) in enumerate(zip(Qs, Ks, VTs)):
            Sc = matmul_nt(Qh, Kh)                                  # Q_h K_h^T   (T, S)
            if mask is None:
                Sc = [[s * scale for s in r] for r in Sc]
            else:
                Sc = [[s * scale + m for s, m in zip(r, mr)] for r, mr in zip(Sc, mask)]
            A = softmax_rows(Sc)                                    # (T, S)
            Ad = A if drops is None else drops[h].forward(A)        # A_h * M_h (dropout, section 5.6)
            Oh = matmul_nt(Ad, VhT)                                 # A_h V_h = A_h (V_h^T)^T  (T, d_h)
            if hm is not None:
                Oh = [[x * hm[h] for x in r] for r in Oh]
            Os.append(Oh)
            As.append(A)
            Ads.append(Ad)
        return _concat_heads(Os), As, Ads

    # --- the backward of forward, then apply (the same forward without caches) ------------------------

    def backward(self, dY):
        """Backward of ``forward``, eqs. (2.11)-(2.16), each line under the forward line it differentiates;
        returns dX for self-attention, (dX, dmemory) for cross-attention."""
        scale, hm = self.scale, self._head_mask
        dO = self.o.backward(dY)                                    # Y = O W_o + b_o: dO = dY W_o^T  (T, d)
        dQs, dKs, dVs = [], [], []
        for h, ((Qh, Kh, Vh, A), Ad, dOh) in enumerate(zip(self.heads, self._Ads, self._split(dO, 0))):
            if hm is not None:                                      # O = [c_h O_h]: dO_h = c_h dO[:, head h]
                dOh = [[g * hm[h] for g in r] for r in dOh]
            dAd = matmul_nt(dOh, Vh)                                # O_h = Ad V_h: dAd = dO_h V_h^T (T, S)
            dA = self.drop_heads[h].backward(dAd)                   # Ad = A * M_h: dA = dAd * M_h
            dVs.append(matmul_tn(Ad, dOh))                          #              dV_h = Ad^T dO_h  (S, d_h)
            dS = [[g * scale for g in r] for r in softmax_backward(A, dA)]  # A = softmax(Q_h K_h^T scale + mask)
            dQh = matmul(dS, Kh)                                    # S = Q_h K_h^T: dQ_h = dS K_h   (T, d_h)
            dKh = matmul_tn(dS, Qh)                                 #                dK_h = dS^T Q_h (S, d_h)
            if self.rope:                                           # RoPE is a rotation: its backward rotates back
                dQh, dKh = rope_rows(dQh, inverse=True), rope_rows(dKh, inverse=True)
            dQs.append(dQh)
            dKs.append(dKh)
        dQ, dK, dV = _concat_heads(dQs), _concat_heads(dKs), _concat_heads(dVs)   # undo the split into heads
        if self.cross:                                              # Q = X W_q, [K V] = M W_kv
            return self.q.backward(dQ), self.kv.backward([k + v for k, v in zip(dK, dV)])
        # [Q K V] = X W_qkv: the Q, K and V paths meet in the batched projection, so
        # dX = dQ W_q^T + dK W_k^T + dV W_v^T comes out of one Linear backward.
        return self.qkv.backward([q + k + v for q, k, v in zip(dQ, dK, dV)])

    def apply(self, X, memory=None, key_padding_mask=None):
        """The same attention as ``forward`` without caching anything (the inference path)."""
        Qs, Ks, Vs = self._project(X, memory, train=False)
        mask = attention_mask(len(X), len(Ks[0]), self.causal, key_padding_mask)
        return self.o.apply(self._attend(Qs, Ks, [list(zip(*Vh)) for Vh in Vs], mask)[0])

    # --- decoding (Generation, below): these read the weights and never touch the training caches -----

    def new_cache(self):
        """An empty key/value cache for causal self-attention: per head [K_h rows, V_h rows]."""
        return [[[], []] for _ in range(self.H)]

    def extend(self, cache, X):
        """Causal self-attention for new rows X (n, d) that follow the positions already in ``cache``: their
        K_h (RoPE-rotated at their absolute positions) and V_h rows join the cache, then each new query
        attends to every cached key up to its own position.  The same numbers as ``forward``'s rows."""
        d, offset = self.d, len(cache[0][0])                        # positions already cached
        QKV = self.qkv.apply(X)                                     # [Q K V] = X W_qkv  (n, 3d)
        Qs, Ks = self._split(QKV, 0), self._split(QKV, d)
        if self.rope:
            Qs, Ks = [rope_rows(Qh, offset=offset) for Qh in Qs], [rope_rows(Kh, offset=offset) for Kh in Ks]
        for (Kc, Vc), Kh, Vh in zip(cache, Ks, self._split(QKV, 2 * d)):
            Kc.extend(Kh)                                           # the cache grows to S = offset + n rows
            Vc.extend(Vh)
        mask = attention_mask(len(X), offset + len(X), causal=True)   # None for one new row: it sees all
        O = self._attend(Qs, [Kc for Kc, _ in cache], [list(zip(*Vc)) for _, Vc in cache], mask)[0]
        return self.o.apply(O)                                      # (n, d)

    def memory_kv(self, memory):
        """Cross-attention keys and values of the encoder memory M (S, d), computed once per source:
        per head (K_h rows (S, d_h), V_h^T (d_h, S))."""
        KV = self.kv.apply(memory)                                  # [K V] = M W_kv  (S, 2d)
        return [(Kh, list(zip(*Vh))) for Kh, Vh in zip(self._split(KV, 0), self._split(KV, self.d))]

    def attend_memory(self, X, mem_kv, key_padding_mask=None):
        """Cross-attention of new rows X (n, d) to the keys/values ``memory_kv`` made of a memory whose
        padded positions ``key_padding_mask`` marks (None: no padding)."""
        Qs = self._split(self.q.apply(X), 0)                        # Q = X W_q, per head (n, d_h)
        mask = attention_mask(len(X), len(mem_kv[0][0]), key_padding_mask=key_padding_mask)
        O = self._attend(Qs, [Kh for Kh, _ in mem_kv], [VhT for _, VhT in mem_kv], mask)[0]
        return self.o.apply(O)                                      # (n, d)


# =====================================================================================
# §4 Positions
# =====================================================================================
# Attention alone is blind to order.  Absolute positions are added to the token embeddings: the
# sine/cosine table of eq. (4.4), or a learned table (both in TokenPositionEmbedding, below).  RoPE,
# eq. (4.7), rotates each head's Q and K pair by pair inside attention instead; its backward is the
# inverse rotation.

POS_SCHEMES = ("none", "sine", "learned", "rope")
ROPE_BASE = 10000.0


def sine_cosine_table(T, d):
    """Sinusoidal positions, eq. (4.4): PE[t][2i] = sin(t w_i), PE[t][2i+1] = cos(t w_i), w_i = 10000^(-2i/d)."""
    table = []
    for t in range(T):
        row = [0.0] * d
        for i in range(0, d, 2):
            w = ROPE_BASE ** (-i / d)
            row[i] = math.sin(t * w)
            if i + 1 < d:
                row[i + 1] = math.cos(t * w)
        table.append(row)
    return table


_SINE_CACHE = {}


def _sine_rows(T, d):
    """The first T rows of the sine table for width d (cached, grown on demand)."""
    tab = _SINE_CACHE.get(d)
    if tab is None or len(tab) < T:
        tab = sine_cosine_table(max(T, 64), d)
        _SINE_CACHE[d] = tab
    return tab[:T]


def rope_rotate(vec, pos, base=ROPE_BASE):
    """RoPE, eq. (4.7): rotate each pair (x_2i, x_2i+1) by the angle pos * base^(-2i/d)."""
    d = len(vec)
    if d % 2:
        raise ShapeError(f"rope_rotate: vector length {d} is odd; RoPE rotates pairs (2i, 2i+1)")
    out = [0.0] * d
    for i in range(0, d, 2):
        a = pos * base ** (-i / d)
        c, s = math.cos(a), math.sin(a)
        x, y = vec[i], vec[i + 1]
        out[i] = x * c - y * s
        out[i + 1] = x * s + y * c
    return out


def rope_rotate_inverse(vec, pos, base=ROPE_BASE):
    """Inverse of ``rope_rotate`` (rotation by -angle = transpose); also the backward of RoPE."""
    return rope_rotate(vec, -pos, base)


_ROPE_CACHE = {}


def _rope_tables(T, d, offset=0):
    """cos and sin of t * w_i for t = offset .. offset+T-1, each (T, d/2); one table per d, grown on demand."""
    tab = _ROPE_CACHE.get(d)
    if tab is None or len(tab[0]) < offset + T:
        n = max(offset + T, 2 * len(tab[0]) if tab else 64)
        ws = [ROPE_BASE ** (-i / d) for i in range(0, d, 2)]
        tab = _ROPE_CACHE[d] = ([[math.cos(t * w) for w in ws] for t in range(n)],
                                [[math.sin(t * w) for w in ws] for t in range(n)])
    return tab[0][offset:offset + T], tab[1][offset:offset + T]


def rope_rows(X, inverse=False, offset=0):
    """Apply RoPE to every row of X (T, d_h), row t at position offset + t; ``inverse`` rotates back
    (the backward pass).  ``offset`` places new rows after a cached prefix during incremental decoding."""
    T, d = len(X), len(X[0])
    cos_t, sin_t = _rope_tables(T, d, offset)
    out = []
    for x, cs, sn in zip(X, cos_t, sin_t):
        r = [0.0] * d
        ev, od = x[0::2], x[1::2]
        if inverse:  # R(-a): (x c + y s, -x s + y c)
            r[0::2] = [a * c + b * s for a, b, c, s in zip(ev, od, cs, sn)]
            r[1::2] = [b * c - a * s for a, b, c, s in zip(ev, od, cs, sn)]
        else:        # R(a): (x c - y s, x s + y c)
            r[0::2] = [a * c - b * s for a, b, c, s in zip(ev, od, cs, sn)]
            r[1::2] = [a * s + b * c for a, b, c, s in zip(ev, od, cs, sn)]
        out.append(r)
    return out


# =====================================================================================
# §5 Layers and blocks
# =====================================================================================
# The position-wise feed-forward network, eq. (5.1), with the tanh GELU of eq. (5.2); the Pre-LN block,
# eq. (5.4), which wraps each sub-layer F as X + Dropout(F(LN(X))); inverted dropout (section 5.6), a
# layer like the others, that drops in training mode only; LayerNorm, eq. (5.7), with its backward in
# the intermediate-variable form, eq. (5.11); and the Xavier initialisation, eq. (5.13), of every
# Linear.  In the code the leaves (GELU, Xavier, Embedding, LayerNorm, Dropout, FFN) precede the blocks.


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x):
    """GELU, tanh approximation, eq. (5.2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + math.tanh(_GELU_C * (x + 0.044715 * x * x * x)))


def gelu_grad(x):
    """d gelu / dx for the tanh approximation (analytic)."""
    t = math.tanh(_GELU_C * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)


def xavier_std(n_in, n_out):
    """Xavier/Glorot normal standard deviation sqrt(2 / (n_in + n_out)), eq. (5.13)."""
    return math.sqrt(2.0 / (n_in + n_out))


class Embedding(Module):
    """Lookup table E (n, d): X[t] = E[ids[t]]; backward scatter-adds dX rows into dE."""

    def __init__(self, n, d, rng=None, std=0.02, name="emb"):
        rng = rng or random.Random(0)
        self.n, self.d, self.name = n, d, name
        self.W = Param([[rng.gauss(0.0, std) for _ in range(d)] for _ in range(n)], name + ".W")

    def params(self):
        return [self.W]

    def forward(self, ids):                                  # ids (T,) ints
        if not len(ids):
            raise ShapeError(f"Embedding '{self.name}': got an empty sequence")
        W, n = self.W.data, self.n
        for i in ids:
            if not (0 <= i < n):
                raise ValueError(f"Embedding '{self.name}': index {i!r} out of range [0, {n})")
        self.ids = list(ids)
        return [list(W[i]) for i in ids]                     # (T, d), copies

    def backward(self, dX):                                  # dX (T, d)
        G = self.W.grad
        for i, g in zip(self.ids, dX):                       # scatter-add: a repeated id gets the sum
            row = G[i]
            row[:] = map(add, row, g)
        return None


class LayerNorm(Module):
    """y = gamma * (x - mu) / sqrt(var + eps) + beta per row, eq. (5.7); eps = 1e-5, biased variance."""

    def __init__(self, d, eps=1e-5, name="ln"):
        self.d, self.eps, self.name = d, eps, name
        self.gamma = Param([1.0] * d, name + ".gamma")
        self.beta = Param([0.0] * d, name + ".beta")

    def params(self):
        return [self.gamma, self.beta]

    def forward(self, X):                                    # X (T, d)
        _check_matrix(X, self.d, f"LayerNorm '{self.name}'")
        Y, self.XH, self.R = self._normalize(X)              # x-hat and 1/sigma cached for backward
        return Y

    def apply(self, X):
        """LayerNorm without caching anything (the inference path)."""
        return self._normalize(X)[0]

    def _normalize(self, X):
        D, eps = self.d, self.eps
        g, b = self.gamma.data, self.beta.data
        Y, XH, R = [], [], []
        for x in X:
            mu = sum(x) / D
            xc = [v - mu for v in x]
            r = 1.0 / math.sqrt(dot(xc, xc) / D + eps)       # 1 / sqrt(var + eps)
            xh = [v * r for v in xc]                         # x-hat
            Y.append([h * gi + bi for h, gi, bi in zip(xh, g, b)])
            XH.append(xh)
            R.append(r)
        return Y, XH, R

    def backward(self, dY):                                  # dY (T, d)
        """Intermediate-variable form, eq. (5.11): dx = r (dxh - mean(dxh) - xh * mean(dxh * xh))."""
        D, g = self.d, self.gamma.data
        dg, db = self.gamma.grad, self.beta.grad
        dX = []
        for dy, xh, r in zip(dY, self.XH, self.R):
            dg[:] = [a + u * v for a, u, v in zip(dg, dy, xh)]   # dgamma += dy * xh
            db[:] = map(add, db, dy)                             # dbeta  += dy
            dxh = list(map(mul, dy, g))                          # dxh = dy * gamma
            m1 = sum(dxh) / D
            m2 = dot(dxh, xh) / D
            dX.append([r * (u - m1 - h * m2) for u, h in zip(dxh, xh)])
        return dX


class Dropout(Module):
    """Inverted dropout, section 5.6, a layer like the others.  In training mode (``Module.train``) ``forward``
    keeps each entry with probability 1 - p, scaled by 1 / (1 - p), and zeroes the rest: Y = X * M with M
    in {0, 1/(1-p)}, so E[Y] = X; ``backward`` is dX = dY * M, the same mask, kept in ``mask`` until the
    next forward.  Masks are drawn from ``rng``, the random.Random that ``train(rng)`` gives every Dropout
    of a model, so one stream serves them all in the order of the forward pass.  In inference mode
    (``eval()``, the default) or with p = 0 it is the identity and draws nothing; ``apply`` never calls it.
    Every module that drops owns its Dropout layers, in attributes named ``drop...``."""

    def __init__(self, p=0.0, name="drop"):
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: the rate must be a number in [0, 1), got {p!r}")
        self.p, self.name, self.rng, self.mask = float(p), name, None, None

    def forward(self, X):                                    # X (n, m)
        self.mask = M = self._draw(len(X), len(X[0])) if self.training and self.p and X else None
        return X if M is None else [list(map(mul, x, m)) for x, m in zip(X, M)]   # Y = X * M   (n, m)

    def _draw(self, n, m):
        """A fresh (n, m) mask of 0 and 1/(1-p), drawn row by row from ``rng``."""
        if self.rng is None:
            raise ValueError(f"Dropout '{self.name}': training mode needs a random.Random to draw masks "
                             "from: model.train(rng)")
        p, keep, r = self.p, 1.0 / (1.0 - self.p), self.rng.random
        return [[keep if r() >= p else 0.0 for _ in range(m)] for _ in range(n)]

    def backward(self, dY):                                  # dY (n, m)
        M = self.mask
        return dY if M is None else [list(map(mul, g, m)) for g, m in zip(dY, M)]   # Y = X * M: dX = dY * M


class FeedForward(Module):
    """Position-wise FFN, eq. (5.1): FFN(x) = GELU(x W1 + b1) W2 + b2; with ``dropout=p`` its Dropout
    ``drop`` drops the hidden layer in training mode, GELU(x W1 + b1) * M (section 5.6)."""

    def __init__(self, d, d_ff, rng=None, out_scale=1.0, name="ffn", dropout=0.0):
        rng = rng or random.Random(0)
        self.name = name
        self.fc1 = Linear(d, d_ff, rng=rng, name=name + ".fc1")
        self.fc2 = Linear(d_ff, d, rng=rng, std=xavier_std(d_ff, d) * out_scale, name=name + ".fc2")
        self.drop = Dropout(dropout, name=name + ".drop")

    def params(self):
        return self.fc1.params() + self.fc2.params()

    def forward(self, X):                                    # X (T, d)
        U = self.fc1.forward(X)                              # (T, d_ff) pre-activation
        self.U = U
        G = self.drop.forward([list(map(gelu, u)) for u in U])   # GELU(U) * M   (T, d_ff)
        return self.fc2.forward(G)                           # (T, d)

    def apply(self, X):
        """FFN(X) without caching anything (the inference path)."""
        return self.fc2.apply([list(map(gelu, u)) for u in self.fc1.apply(X)])

    def backward(self, dY):
        dG = self.drop.backward(self.fc2.backward(dY))      # G = GELU(U) * M: dGELU = dG * M  (T, d_ff)
        dU = [list(map(mul, dg, map(gelu_grad, u))) for dg, u in zip(dG, self.U)]
        return self.fc1.backward(dU)


class EncoderBlock(Module):
    """Pre-LN encoder block, eq. (5.4): X1 = X + MHA(LN1(X)); Y = X1 + FFN(LN2(X1)).

    With ``dropout=p`` (section 5.6) its Dropout layers ``drop1`` and ``drop2`` (numbered as the LayerNorms)
    drop each branch's output before its residual add in training mode, X1 = X + MHA(LN1(X)) * M_1,
    Y = X1 + FFN(LN2(X1)) * M_2, and the attention and FFN drop inside (see MultiHeadAttention, FeedForward)."""

    def __init__(self, d, n_heads, d_ff, rng=None, rope=False, causal=False, out_scale=1.0, name="block",
                 dropout=0.0):
        rng = rng or random.Random(0)
        self.name = name
        self.ln1 = LayerNorm(d, name=name + ".ln1")
        self.attn = MultiHeadAttention(d, n_heads, rng=rng, causal=causal, rope=rope,
                                       out_scale=out_scale, name=name + ".attn", dropout=dropout)
        self.drop1 = Dropout(dropout, name=name + ".drop1")
        self.ln2 = LayerNorm(d, name=name + ".ln2")
        self.ffn = FeedForward(d, d_ff, rng=rng, out_scale=out_scale, name=name + ".ffn", dropout=dropout)
        self.drop2 = Dropout(dropout, name=name + ".drop2")

    def params(self):
        return self.ln1.params() + self.attn.params() + self.ln2.params() + self.ffn.params()

    def forward(self, X, key_padding_mask=None):                       # X (T, d)
        A = self.drop1.forward(self.attn.forward(self.ln1.forward(X), key_padding_mask=key_padding_mask))
        X1 = add_mat(X, A)                                              # X1 = X + MHA(LN1(X)) * M1
        F = self.drop2.forward(self.ffn.forward(self.ln2.forward(X1)))
        return add_mat(X1, F)                                           # Y = X1 + FFN(LN2(X1)) * M2

    def apply(self, X, key_padding_mask=None):
        """``forward`` without caching anything (the inference path)."""
        X1 = add_mat(X, self.attn.apply(self.ln1.apply(X), key_padding_mask=key_padding_mask))
        return add_mat(X1, self.ffn.apply(self.ln2.apply(X1)))

    def backward(self, dY):
        dX1 = add_mat(dY, self.ln2.backward(self.ffn.backward(self.drop2.backward(dY))))   # Y = X1 + FFN(..) * M2
        return add_mat(dX1, self.ln1.backward(self.attn.backward(self.drop1.backward(dX1))))  # X1 = X + MHA(..) * M1


class DecoderBlock(Module):
    """Pre-LN decoder block, eq. (5.4) three times:
    X1 = X + CausalMHA(LN1(X)); X2 = X1 + CrossMHA(LN2(X1), memory); Y = X2 + FFN(LN3(X2)).

    With ``cross=False`` the cross-attention sub-layer is left out (the decoder-only LM block).
    With ``dropout=p`` each branch's output is dropped before its residual add, as in EncoderBlock, by the
    Dropout layers ``drop1`` (self-attention), ``drop2`` (cross-attention, when there is one), ``drop3`` (FFN).
    """

    def __init__(self, d, n_heads, d_ff, rng=None, rope=False, cross=True, out_scale=1.0, name="block",
                 dropout=0.0):
        rng = rng or random.Random(0)
        self.name, self.has_cross = name, cross
        self.ln1 = LayerNorm(d, name=name + ".ln1")
        self.self_attn = MultiHeadAttention(d, n_heads, rng=rng, causal=True, rope=rope,
                                            out_scale=out_scale, name=name + ".self_attn", dropout=dropout)
        self.drop1 = Dropout(dropout, name=name + ".drop1")
        if cross:
            self.ln2 = LayerNorm(d, name=name + ".ln2")
            self.cross_attn = MultiHeadAttention(d, n_heads, rng=rng, cross=True, out_scale=out_scale,
                                                 name=name + ".cross_attn", dropout=dropout)
            self.drop2 = Dropout(dropout, name=name + ".drop2")
        self.ln3 = LayerNorm(d, name=name + ".ln3")
        self.ffn = FeedForward(d, d_ff, rng=rng, out_scale=out_scale, name=name + ".ffn", dropout=dropout)
        self.drop3 = Dropout(dropout, name=name + ".drop3")

    def params(self):
        ps = self.ln1.params() + self.self_attn.params()
        if self.has_cross:
            ps += self.ln2.params() + self.cross_attn.params()
        return ps + self.ln3.params() + self.ffn.params()

    def forward(self, X, memory=None, memory_padding_mask=None):      # X (T, d); memory (S, d)
        A = self.drop1.forward(self.self_attn.forward(self.ln1.forward(X)))
        X = add_mat(X, A)                                               # X1 = X + CausalMHA(LN1(X)) * M1
        if self.has_cross:
            C = self.cross_attn.forward(self.ln2.forward(X), memory, key_padding_mask=memory_padding_mask)
            X = add_mat(X, self.drop2.forward(C))                       # X2 = X1 + CrossMHA(..) * M2
        F = self.drop3.forward(self.ffn.forward(self.ln3.forward(X)))
        return add_mat(X, F)                                            # Y = X2 + FFN(LN3(X2)) * M3

    def step(self, cache, X, mem_kv=None, memory_padding_mask=None):
        """``forward`` for new rows X (n, d) that follow the positions in the self-attention key/value
        ``cache``, with the precomputed cross-attention memory keys/values (the inference path)."""
        X = add_mat(X, self.self_attn.extend(cache, self.ln1.apply(X)))
        if self.has_cross:
            X = add_mat(X, self.cross_attn.attend_memory(self.ln2.apply(X), mem_kv, memory_padding_mask))
        return add_mat(X, self.ffn.apply(self.ln3.apply(X)))

    def backward(self, dY):
        """Returns (dX, dmemory); dmemory is None without cross-attention."""
        dX = add_mat(dY, self.ln3.backward(self.ffn.backward(self.drop3.backward(dY))))   # Y = X2 + FFN(..) * M3
        dM = None
        if self.has_cross:
            dXc, dM = self.cross_attn.backward(self.drop2.backward(dX))              # X2 = X1 + CrossMHA(..) * M2
            dX = add_mat(dX, self.ln2.backward(dXc))
        dX = add_mat(dX, self.ln1.backward(self.self_attn.backward(self.drop1.backward(dX))))  # X1 = X + MHA(..) * M1
        return dX, dM


# =====================================================================================
# §6 Models
# =====================================================================================
# The three model families, each an embedding (TokenPositionEmbedding: tokens plus positions), a stack
# of blocks and a head: TransformerEncoder (every token sees every token; mean-pooled, for regression),
# TransformerLM (decoder-only: the causal mask of eq. (6.1) hides every later token) and EncoderDecoder
# (an encoder, and a decoder that also attends to the encoder's output).  ``dropout=p`` gives every
# Dropout layer inside a model the rate p.


class TokenPositionEmbedding(Module):
    """X[t] = E[ids[t]] + P[t]: token embedding plus the chosen absolute position scheme.

    pos = "none" (no positions), "sine" (fixed table, eq. 4.4), "learned" (a trainable table of
    ``max_len`` rows, init std 0.02; rows never visited in training keep their initial values),
    "rope" (nothing is added here: attention rotates Q and K instead).
    Token embeddings are initialised N(0, 1/d) so that a row has norm about 1.
    With ``dropout=p`` its Dropout ``drop`` drops the sum in training mode, X * M (section 5.6).

    ``token_features`` (optional, V rows of k fixed numbers per token, e.g. an element's group, period
    and electronegativity) adds a learned projection of them: X[t] = E[ids[t]] + F[ids[t]] W_f + P[t],
    with W_f (k, d) trained and F never changed.  Tokens that share features share that prior.
    """

    def __init__(self, vocab_size, d, pos="sine", max_len=512, rng=None, name="embed", token_features=None,
                 dropout=0.0):
        if pos not in POS_SCHEMES:
            raise ValueError(f"unknown position scheme {pos!r}; choose one of {POS_SCHEMES}")
        rng = rng or random.Random(0)
        self.d, self.pos, self.max_len, self.name = d, pos, max_len, name
        self.drop = Dropout(dropout, name=name + ".drop")
        self.tok = Embedding(vocab_size, d, rng=rng, std=d ** -0.5, name=name + ".tok")
        self.pe = Embedding(max_len, d, rng=rng, std=0.02, name=name + ".pos") if pos == "learned" else None
        self.feat, self.feat_proj = None, None
        if token_features is not None:
            if len(token_features) != vocab_size or len({len(r) for r in token_features}) != 1:
                raise ShapeError(f"TokenPositionEmbedding '{name}': token_features must be {vocab_size} rows of "
                                 f"equal length, got {len(token_features)} rows")
            self.feat = [[float(x) for x in r] for r in token_features]                 # F (V, k), fixed
            self.feat_proj = Linear(len(self.feat[0]), d, bias=False, rng=rng, name=name + ".feat")

    def params(self):
        return (self.tok.params() + (self.pe.params() if self.pe else [])
                + (self.feat_proj.params() if self.feat_proj else []))

    def _add_features(self, X, ids, train):
        if self.feat_proj is None:
            return X
        rows = [self.feat[i] for i in ids]                                 # F[ids]  (T, k)
        return add_mat(X, (self.feat_proj.forward if train else self.feat_proj.apply)(rows))  # + F[ids] W_f

    def forward(self, ids):                                              # ids (T,)
        T = len(ids)
        X = self._add_features(self.tok.forward(ids), ids, train=True)   # (T, d)
        if self.pos == "sine":
            X = add_mat(X, _sine_rows(T, self.d))
        elif self.pos == "learned":
            if T > self.max_len:
                raise ShapeError(f"TokenPositionEmbedding '{self.name}': sequence of length {T} exceeds "
                                 f"the learned position table (max_len={self.max_len})")
            X = add_mat(X, self.pe.forward(range(T)))
        return self.drop.forward(X)                                      # (E[ids] + P) * M in training

    def apply(self, ids, offset=0):
        """Embeddings of ``ids`` placed at positions offset .. offset+T-1, without caching anything."""
        T, W, n = len(ids), self.tok.W.data, self.tok.n
        for i in ids:
            if not (0 <= i < n):
                raise ValueError(f"Embedding '{self.tok.name}': index {i!r} out of range [0, {n})")
        X = self._add_features([list(W[i]) for i in ids], ids, train=False)  # (T, d)
        if self.pos == "sine":
            X = add_mat(X, _sine_rows(offset + T, self.d)[offset:])
        elif self.pos == "learned":
            if offset + T > self.max_len:
                raise ShapeError(f"TokenPositionEmbedding '{self.name}': position {offset + T - 1} is past "
                                 f"the learned position table (max_len={self.max_len})")
            X = add_mat(X, self.pe.W.data[offset:offset + T])
        return X

    def backward(self, dX):
        dX = self.drop.backward(dX)                                      # X = (E[ids] + P) * M: dX * M
        self.tok.backward(dX)
        if self.pe is not None:
            self.pe.backward(dX)
        if self.feat_proj is not None:
            self.feat_proj.backward(dX)                                  # dW_f += F[ids]^T dX


def _check_pos(pos):
    if pos not in POS_SCHEMES:
        raise ValueError(f"unknown position scheme {pos!r}; choose one of {POS_SCHEMES}")


def _model_dropout(config, rate):
    """The rate every Dropout layer of a model gets (checked by Dropout); it joins ``config`` (and so the saved
    file and a checkpoint's fingerprint) only when it is not 0, so a model without dropout keeps its old config."""
    p = Dropout(rate).p
    if p:
        config["dropout"] = p
    return p


class TransformerEncoder(Module):
    """Encoder for regression: embeddings + positions, L Pre-LN encoder blocks, final LayerNorm,
    mean pooling over the non-pad positions, and a linear head with ``n_out`` outputs.

    forward(ids) -> list of n_out floats; backward(dy) takes dL/d(output) (n_out,).
    ``dropout=p`` (default 0: none) drops, in training mode only, the embedding sum, the attention weights,
    each residual branch's output and the FFN hidden layer (section 5.6; see ``Dropout``).
    """

    def __init__(self, vocab_size, d_model=48, n_heads=4, n_layers=2, d_ff=None, n_out=1, pos="sine",
                 max_len=512, pad_id=None, pooling="mean", seed=0, token_features=None, dropout=0.0):
        _check_pos(pos)
        if pooling != "mean":
            raise ValueError(f"unknown pooling {pooling!r}; only 'mean' is implemented")
        d_ff = 2 * d_model if d_ff is None else d_ff
        self.config = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                           d_ff=d_ff, n_out=n_out, pos=pos, max_len=max_len, pad_id=pad_id,
                           pooling=pooling, seed=seed)
        if token_features is not None:
            self.config["token_features"] = [list(r) for r in token_features]   # saved with the model
        p = _model_dropout(self.config, dropout)
        rng = random.Random(seed)
        self.name, self.pad_id = "encoder", pad_id
        out_scale = 1.0 / math.sqrt(2 * n_layers)
        self.embed = TokenPositionEmbedding(vocab_size, d_model, pos, max_len, rng, name="embed",
                                            token_features=token_features, dropout=p)
        self.blocks = [EncoderBlock(d_model, n_heads, d_ff, rng, rope=(pos == "rope"), out_scale=out_scale,
                                    name=f"blocks.{i}", dropout=p) for i in range(n_layers)]
        self.ln_f = LayerNorm(d_model, name="ln_f")
        self.head = Linear(d_model, n_out, rng=rng, name="head")

    def params(self):
        ps = self.embed.params()
        for b in self.blocks:
            ps += b.params()
        return ps + self.ln_f.params() + self.head.params()

    def encode(self, ids):
        """Hidden states after the final LayerNorm, (T, d)."""
        mask = padding_mask(ids, self.pad_id)
        X = self.embed.forward(ids)
        for b in self.blocks:
            X = b.forward(X, key_padding_mask=mask)
        self._mask = mask
        return self.ln_f.forward(X)

    def forward(self, ids):
        Hs = self.encode(ids)                                           # (T, d)
        keep = [t for t in range(len(ids)) if not (self._mask and self._mask[t])]
        if not keep:
            raise ValueError("TransformerEncoder: every position is padding; nothing to pool")
        self._keep, self._T = keep, len(ids)
        inv = 1.0 / len(keep)
        pooled = [s * inv for s in map(sum, zip(*(Hs[t] for t in keep)))]   # mean over non-pad (d,)
        return self.head.forward([pooled])[0]                            # (n_out,)

    def backward(self, dy):
        dpooled = self.head.backward([list(dy)])[0]                      # (d,)
        inv = 1.0 / len(self._keep)
        g = [v * inv for v in dpooled]
        dH = [[0.0] * len(g) for _ in range(self._T)]
        for t in self._keep:
            dH[t] = list(g)
        dX = self.ln_f.backward(dH)
        for b in reversed(self.blocks):
            dX = b.backward(dX)
        self.embed.backward(dX)


class TransformerLM(Module):
    """Decoder-only causal language model: embeddings + positions, L causal Pre-LN blocks,
    final LayerNorm and an output head; forward(ids) -> logits (T, V).

    ``tie_weights=True`` uses the token embedding E as the output matrix (logits = H E^T, no bias);
    its gradient is then the sum of the input scatter-add and H^T dlogits, eq. (8.5).
    ``dropout=p`` (default 0: none) drops, in training mode only, the embedding sum, the attention weights,
    each residual branch's output and the FFN hidden layer (section 5.6; see ``Dropout``).
    """

    def __init__(self, vocab_size, d_model=48, n_heads=4, n_layers=2, d_ff=None, max_len=512, pos="sine",
                 tie_weights=False, seed=0, dropout=0.0):
        _check_pos(pos)
        d_ff = 2 * d_model if d_ff is None else d_ff
        self.config = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                           d_ff=d_ff, max_len=max_len, pos=pos, tie_weights=tie_weights, seed=seed)
        p = _model_dropout(self.config, dropout)
        rng = random.Random(seed)
        self.name, self.tie_weights, self.max_len = "lm", tie_weights, max_len
        out_scale = 1.0 / math.sqrt(2 * n_layers)
        self.embed = TokenPositionEmbedding(vocab_size, d_model, pos, max_len, rng, name="embed", dropout=p)
        self.blocks = [DecoderBlock(d_model, n_heads, d_ff, rng, rope=(pos == "rope"), cross=False,
                                    out_scale=out_scale, name=f"blocks.{i}", dropout=p)
                       for i in range(n_layers)]
        self.ln_f = LayerNorm(d_model, name="ln_f")
        self.head = None if tie_weights else Linear(d_model, vocab_size, rng=rng, name="head")

    def params(self):
        ps = self.embed.params()
        for b in self.blocks:
            ps += b.params()
        return ps + self.ln_f.params() + (self.head.params() if self.head else [])

    def forward(self, ids):                                              # ids (T,)
        X = self.embed.forward(ids)                                      # (T, d)
        for b in self.blocks:
            X = b.forward(X)
        Hs = self.ln_f.forward(X)                                        # (T, d)
        if self.tie_weights:
            self._H = Hs
            return matmul_nt(Hs, self.embed.tok.W.data)                  # logits = H E^T   (T, V)
        return self.head.forward(Hs)

    def backward(self, dlogits):                                         # dlogits (T, V)
        if self.tie_weights:
            E = self.embed.tok.W
            add_inplace(E.grad, matmul_tn(dlogits, self._H))             # dE += dlogits^T H   (eq. 8.5)
            dX = matmul(dlogits, E.data)                                 # dH = dlogits E
        else:
            dX = self.head.backward(dlogits)
        dX = self.ln_f.backward(dX)
        for b in reversed(self.blocks):
            dX, _ = b.backward(dX)
        self.embed.backward(dX)                                          # + scatter-add into E


class EncoderDecoder(Module):
    """Sequence-to-sequence Transformer: a source encoder (L Pre-LN encoder blocks + LayerNorm) and a
    target decoder (L blocks of causal self-attention, cross-attention to the encoder memory and FFN,
    + LayerNorm), separate source and target embeddings and a linear output head.

    forward(src, tgt_in) -> logits (T, V_tgt).  ``src_pad_id`` masks padded source keys.
    ``dropout=p`` (default 0: none) drops, in training mode only, both embedding sums, the attention weights,
    each residual branch's output and the FFN hidden layers (section 5.6; see ``Dropout``).
    """

    def __init__(self, src_vocab_size, tgt_vocab_size, d_model=48, n_heads=4, n_layers=2, d_ff=None,
                 max_len=512, pos="sine", src_pad_id=None, seed=0, dropout=0.0):
        _check_pos(pos)
        d_ff = 2 * d_model if d_ff is None else d_ff
        self.config = dict(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=d_model,
                           n_heads=n_heads, n_layers=n_layers, d_ff=d_ff, max_len=max_len, pos=pos,
                           src_pad_id=src_pad_id, seed=seed)
        p = _model_dropout(self.config, dropout)
        rng = random.Random(seed)
        self.name, self.src_pad_id, self.max_len = "seq2seq", src_pad_id, max_len
        out_scale = 1.0 / math.sqrt(2 * n_layers)
        rope = pos == "rope"
        self.src_embed = TokenPositionEmbedding(src_vocab_size, d_model, pos, max_len, rng, name="src_embed",
                                                dropout=p)
        self.enc_blocks = [EncoderBlock(d_model, n_heads, d_ff, rng, rope=rope, out_scale=out_scale,
                                        name=f"enc.{i}", dropout=p) for i in range(n_layers)]
        self.enc_ln = LayerNorm(d_model, name="enc_ln")
        self.tgt_embed = TokenPositionEmbedding(tgt_vocab_size, d_model, pos, max_len, rng, name="tgt_embed",
                                                dropout=p)
        self.dec_blocks = [DecoderBlock(d_model, n_heads, d_ff, rng, rope=rope, cross=True, out_scale=out_scale,
                                        name=f"dec.{i}", dropout=p) for i in range(n_layers)]
        self.dec_ln = LayerNorm(d_model, name="dec_ln")
        self.head = Linear(d_model, tgt_vocab_size, rng=rng, name="head")

    def params(self):
        ps = self.src_embed.params()
        for b in self.enc_blocks:
            ps += b.params()
        ps += self.enc_ln.params() + self.tgt_embed.params()
        for b in self.dec_blocks:
            ps += b.params()
        return ps + self.dec_ln.params() + self.head.params()

    def encode(self, src):
        """Encoder memory (S, d) for the source ids."""
        mask = self._src_mask = padding_mask(src, self.src_pad_id)
        X = self.src_embed.forward(src)
        for b in self.enc_blocks:
            X = b.forward(X, key_padding_mask=mask)
        return self.enc_ln.forward(X)

    def decode(self, tgt_in, memory):
        """Logits (T, V_tgt) for the target prefix ``tgt_in`` given the encoder memory."""
        Y = self.tgt_embed.forward(tgt_in)
        for b in self.dec_blocks:
            Y = b.forward(Y, memory, memory_padding_mask=self._src_mask)
        return self.head.forward(self.dec_ln.forward(Y))

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, self.encode(src))

    def backward(self, dlogits):
        dY = self.dec_ln.backward(self.head.backward(dlogits))
        dM = None
        for b in reversed(self.dec_blocks):
            dY, dMb = b.backward(dY)
            dM = dMb if dM is None else add_mat(dM, dMb)                  # memory feeds every decoder block
        self.tgt_embed.backward(dY)
        dX = self.enc_ln.backward(dM)
        for b in reversed(self.enc_blocks):
            dX = b.backward(dX)
        self.src_embed.backward(dX)


MODEL_CLASSES = {c.__name__: c for c in (TransformerEncoder, TransformerLM, EncoderDecoder)}


# =====================================================================================
# §6 Losses
# =====================================================================================
# Cross-entropy over rows, with label smoothing, and its gradient p - q, eq. (6.4); the mean squared
# error; and the per-sample task losses train calls (lm_loss, seq2seq_loss, regression_loss), each
# the forward, the loss and the backward of one sample.


def cross_entropy_rows(logits, targets, ignore_index=None, label_smoothing=0.0, reduction="mean"):
    """Mean cross-entropy over the rows whose target is not ``ignore_index``; returns (loss, dlogits).

    With label smoothing eps the target distribution is q = (1 - eps) onehot + eps / V, spread over
    all V classes (PyTorch's convention).  The gradient of the returned mean is (p - q) / N, eq. (6.4),
    where N counts the rows that are not ignored; ignored rows get zero gradient.
    ``reduction="sum"``: the SUM over the counted rows instead, gradient p - q (train's per-token loss).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy_rows: reduction must be 'mean' or 'sum', got {reduction!r}")
    if len(logits) != len(targets):
        raise ShapeError(f"cross_entropy_rows: {len(logits)} rows of logits but {len(targets)} targets")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"cross_entropy_rows: label_smoothing must be in [0, 1), got {label_smoothing}")
    exp, log = math.exp, math.log
    V = len(logits[0]) if logits else 0
    counted = [i for i, y in enumerate(targets) if y != ignore_index]
    dlogits = [[0.0] * len(r) for r in logits]
    if not counted:
        return 0.0, dlogits
    eps = label_smoothing
    inv_n = 1.0 / len(counted) if reduction == "mean" else 1.0
    total = 0.0
    for i in counted:
        z, y = logits[i], targets[i]
        if not 0 <= y < V:
            raise ValueError(f"cross_entropy_rows: target {y!r} in row {i} is outside [0, {V})")
        m = max(z)
        e = [exp(v - m) for v in z]
        s = sum(e)
        lse = m + log(s)                                      # log sum exp
        nll = lse - z[y]
        if eps:
            total += (1.0 - eps) * nll + eps * (lse - sum(z) / V)
        else:
            total += nll
        p = [v / s for v in e]
        if eps:
            off = eps / V
            g = [(pv - off) * inv_n for pv in p]
            g[y] -= (1.0 - eps) * inv_n
        else:
            g = [pv * inv_n for pv in p]
            g[y] -= inv_n
        dlogits[i] = g
    return total * inv_n, dlogits


def mse_loss(pred, target):
    """Mean squared error over a vector; returns (loss, dpred) with dpred = 2 (pred - target) / n."""
    if len(pred) != len(target):
        raise ShapeError(f"mse_loss: prediction has {len(pred)} entries, target {len(target)}")
    n = len(pred)
    diff = [p - y for p, y in zip(pred, target)]
    return sum(v * v for v in diff) / n, [2.0 * v / n for v in diff]


def lm_loss(model, sample, backward=True, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Next-token loss of a TransformerLM on one sequence: the mean over its counted tokens, eq. (6.4).

    ``sample`` is either a list of ids (inputs ids[:-1], targets ids[1:]) or a pair (inputs, targets)
    of equal length whose targets may hold ``ignore_index`` at positions that do not count.
    ``reduction="sum"`` returns (summed token loss, number of counted tokens) and back-propagates the
    sum: what ``train(..., loss_reduction="token")`` adds up over a batch before dividing by its tokens.
    """
    if isinstance(sample, tuple):
        inputs, targets = sample
    else:
        inputs, targets = sample[:-1], sample[1:]
    logits = model.forward(inputs)
    return _token_loss(model, logits, targets, backward, ignore_index, label_smoothing, reduction)


def _token_loss(model, logits, targets, backward, ignore_index, label_smoothing, reduction):
    """cross_entropy_rows of the logits, back-propagated; the loss, or (sum, counted tokens) for "sum"."""
    loss, dlogits = cross_entropy_rows(logits, targets, ignore_index, label_smoothing, reduction)
    if backward:
        model.backward(dlogits)
    if reduction == "sum":
        return loss, sum(1 for y in targets if y != ignore_index)
    return loss


def seq2seq_loss(model, sample, backward=True, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Teacher-forced loss of an EncoderDecoder on one pair (src_ids, tgt_ids), tgt = [bos, ..., eos]:
    the mean over the counted target tokens, or with ``reduction="sum"`` (sum, count) as ``lm_loss``."""
    src, tgt = sample
    logits = model.forward(src, tgt[:-1])
    return _token_loss(model, logits, tgt[1:], backward, ignore_index, label_smoothing, reduction)


def regression_loss(model, sample, backward=True):
    """MSE of a TransformerEncoder on one pair (ids, y), y a float or a list of n_out floats."""
    ids, y = sample
    y = list(y) if isinstance(y, (list, tuple)) else [y]
    loss, dpred = mse_loss(model.forward(ids), y)
    if backward:
        model.backward(dpred)
    return loss


# =====================================================================================
# §7 Optimisation
# =====================================================================================
# Adam with bias correction, eqs. (7.7)-(7.8), and optional decoupled weight decay (AdamW).


class Adam:
    """Adam with bias correction, eqs. (7.7)-(7.8), and optional decoupled weight decay (AdamW).

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    theta -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps);
    with weight_decay > 0, theta -= lr * weight_decay * theta first (not added to the gradient).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.t = 0
        self.m = [zeros_like(p.data) for p in self.params]
        self.v = [zeros_like(p.data) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.zero_grad()

    def step(self, lr=None, grad_scale=1.0):
        """One update with learning rate ``lr`` (default self.lr) and g = grad_scale * Param.grad (``train``
        folds the batch mean and the clipping factor into grad_scale: one pass over the parameters).

        eq. (7.8) as printed:  theta -= lr m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)
        as computed here:      theta -= k m / (sqrt(v) + eps sqrt(1 - b2^t)), k = lr sqrt(1 - b2^t) / (1 - b1^t)
        The same number: multiply the top and the bottom of the printed fraction by sqrt(1 - b2^t).  (The
        floats differ in the last bits, so the computed form, two divisions fewer per entry, stays.)
        """
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        bc2_sqrt = math.sqrt(1.0 - b2 ** self.t)
        k = lr * bc2_sqrt / (1.0 - b1 ** self.t)
        eps = self.eps * bc2_sqrt
        c1, c2 = (1.0 - b1) * grad_scale, (1.0 - b2) * grad_scale * grad_scale
        sqrt = math.sqrt
        decay = 1.0 - lr * self.weight_decay
        for p, m, v in zip(self.params, self.m, self.v):
            mr = m if m and isinstance(m[0], list) else [m]
            vr = v if v and isinstance(v[0], list) else [v]
            for w, g, mi, vi in zip(p.rows("data"), p.rows("grad"), mr, vr):
                mi[:] = [b1 * a + c1 * x for a, x in zip(mi, g)]          # eq. (7.7) first moment
                vi[:] = [b2 * a + c2 * x * x for a, x in zip(vi, g)]      # second moment
                if self.weight_decay:
                    w[:] = [x * decay for x in w]                          # decoupled decay (AdamW)
                w[:] = [x - k * a / (sqrt(b) + eps) for x, a, b in zip(w, mi, vi)]   # eq. (7.8)

    def state_dict(self):
        return {"t": self.t, "m": self.m, "v": self.v}


# =====================================================================================
# §8 Schedules and clipping
# =====================================================================================
# The learning rate as a function of the step, eq. (8.1): noam_lr, the original schedule, and
# warmup_inv_sqrt_lr, the one train uses (a linear warmup to a peak, then 1/sqrt(step)); global-norm
# gradient clipping, eq. (8.3).  (The chapter's tied embedding, eq. (8.5), is TransformerLM's
# tie_weights, above.)


def noam_lr(step, d_model, warmup):
    """The original Transformer schedule, eq. (8.1): lr = d^-0.5 min(t^-0.5, t warmup^-1.5); 0 at t = 0."""
    if step <= 0:
        return 0.0
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def warmup_inv_sqrt_lr(step, peak_lr, warmup):
    """Linear warmup to ``peak_lr`` at step = warmup, then peak_lr sqrt(warmup / step); 0 at step 0."""
    if step <= 0:
        return 0.0
    if warmup <= 0:
        return peak_lr
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))


def grad_norm(params):
    """Global L2 norm of all gradients, sqrt(sum over every entry of g^2)."""
    return math.sqrt(sum(dot(r, r) for p in params for r in p.rows("grad")))


def clip_grad_norm(params, max_norm, *, batch_size=1, scale=True):
    """Global-norm clipping, eq. (8.3): g <- g min(1, max_norm / ||g||).  Returns (||g||, the factor).

    ``batch_size=B``: Param.grad holds the SUM of B per-sample gradients (as in ``train``) and g is their
    mean, so ||g|| = ||Param.grad|| / B.  The factor is min(1, max_norm / (||g|| + 1e-6)) (PyTorch's 1e-6),
    1 when max_norm is None or 0.  ``scale=True`` multiplies every Param.grad by it in place; ``train``
    passes scale=False and folds the factor (with the 1/B) into Adam.step's ``grad_scale`` instead.
    """
    norm = grad_norm(params) / batch_size
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm else 1.0
    if scale and coef < 1.0:
        for p in params:
            for r in p.rows("grad"):
                r[:] = [x * coef for x in r]
    return norm, coef


# =====================================================================================
# §8 Training
# =====================================================================================
# train(), the recipe every experiment uses: per batch, training mode on (so that a model built with
# ``dropout=p`` drops, sample i of step t with masks from random.Random(f"dropout:{seed}:{t}:{i}"), the
# same for any worker count), the forward, loss and backward of every sample, inference mode back on,
# the clipping, and Adam's step at the schedule's learning rate.  _TrainingRun keeps the bookkeeping
# (position, history, progress lines, checkpoints); the guards, SIGTERM, checkpoint files and worker
# processes train calls are in Part II.


def train(model, train_data, loss_fn, *, valid_data=None, epochs=1, batch_size=8, lr=2e-3, warmup=150,
          clip=1.0, weight_decay=0.0, betas=(0.9, 0.999), seed=0, workers=None, max_steps=None,
          log_every=None, epoch_fn=None, verbose=True, tag="train", checkpoint=None, checkpoint_every=60.0,
          loss_reduction="sample"):
    """The one training loop every experiment uses.  Each step: the summed gradient of a batch of
    ``batch_size`` samples, its mean's global norm clipped to ``clip`` (eq. 8.3), one Adam step (eq. 7.8)
    at the learning rate that warms up to ``lr`` over ``warmup`` steps, then falls as 1/sqrt(step) (eq. 8.1).

    ``loss_fn(model, sample, backward=True) -> float`` is a per-sample loss that runs forward + backward,
    adding into Param.grad (lm_loss, seq2seq_loss, regression_loss); with backward=False only the forward
    (validation).  ``workers`` processes share each batch (default: the number of cores; 1 disables it;
    fork only).  ``epoch_fn(model, epoch) -> dict`` adds task metrics to each epoch's record.  Samples are
    shuffled each epoch with random.Random(seed).  ``checkpoint=path`` saves the run now and then and on
    Ctrl-C; the same call again resumes it, bit-identically (see _TrainingRun).

    Returns a history dict: per-step records (loss, lr, grad norm), per-epoch records (mean train loss,
    validation loss, metrics, elapsed seconds), and the settings.  Losses are means over samples of the
    per-sample loss (lm_loss: each sequence's mean over its counted tokens, eq. 6.4); ``loss_reduction=
    "token"``: a batch's summed token losses over its counted tokens (loss_fn(..., reduction="sum") ->
    (sum, tokens)), validation likewise.  Dropout: the section's header.  Bad input, NonFiniteLossError,
    SIGTERM: Part II.
    """
    settings = _train_settings(locals())                           # arguments checked, worker count settled
    dropping = any(m.p for m in model.modules() if isinstance(m, Dropout))   # a rate > 0 anywhere (§5)
    opt = Adam(model.params(), lr=lr, betas=betas, weight_decay=weight_decay)
    run = _TrainingRun(model, opt, train_data, valid_data, loss_fn, settings, checkpoint=checkpoint,
                       checkpoint_every=checkpoint_every, log_every=log_every, verbose=verbose, tag=tag)
    runner = _runner(model, {"train": train_data, "valid": valid_data or []}, loss_fn, settings["workers"],
                     loss_reduction)                               # this process, or forked workers (Part II)
    restore_sigterm = sigterm_as_ctrl_c()                          # SIGTERM stops the run as Ctrl-C does
    try:
        while run.epoch <= epochs and run.step < run.total_steps:
            for batch in run.epoch_batches():                      # this epoch's shuffled batches still to do
                model.zero_grad()
                model.train()                                      # training mode: the Dropout layers drop
                drop_key = f"dropout:{seed}:{run.step + 1}" if dropping else None   # this step's masks
                total, n = runner.run("grad", "train", batch, drop_key)   # forward, loss, backward: grad = SUM
                model.eval()                                       # inference mode: nothing else drops
                n = n or 1                                         # n: samples, or counted tokens ("token")
                loss = total / n
                gnorm, coef = clip_grad_norm(opt.params, clip, batch_size=n, scale=False)  # eq. (8.3)
                if not (math.isfinite(loss) and math.isfinite(gnorm)):     # no update: nothing has changed
                    raise _non_finite_loss(run.step + 1, loss, gnorm, model, loss_fn, train_data, batch, tag)
                step_lr = warmup_inv_sqrt_lr(run.step + 1, lr, warmup)             # eq. (8.1)
                run.begin_update()                                 # until record_step, Ctrl-C undoes the step
                opt.step(step_lr, grad_scale=coef / n)             # eq. (7.8), g = coef * (SUM / n)
                run.record_step(loss, step_lr, gnorm)              # history; log line; timed checkpoint
            valid_loss = _mean_of(runner.run("eval", "valid", list(range(len(valid_data))))) if valid_data else None
            run.end_epoch(valid_loss, epoch_fn)                    # epoch record; checkpoint; log line
    except KeyboardInterrupt:
        runner.close(wait=False)                                   # workers hold no state: stop them at once
        run.interrupted()                                          # checkpoint (unless half-updated), message
        raise
    finally:
        model.eval()
        runner.close()
        restore_sigterm()
    return run.finish()


def _train_settings(args):
    """``train``'s arguments checked (``_check_train_args``, ``_check_loss_reduction``), its worker count
    settled (``_usable_workers``), and its settings record (history and checkpoint fingerprint) made from
    them; loss_reduction only when not the default, so checkpoints written before the option still resume."""
    _check_train_args(args["train_data"], args["valid_data"], args["loss_fn"],
                      **{k: args[k] for k in ("lr", "clip", "weight_decay", "betas", "warmup")})
    workers = _usable_workers(args["workers"], args["batch_size"], args["tag"])
    _check_loss_reduction(args["loss_reduction"], args["loss_fn"])
    settings = {k: args[k] for k in ("epochs", "batch_size", "lr", "warmup", "clip", "weight_decay")}
    settings.update(betas=list(args["betas"]), seed=args["seed"], workers=workers, max_steps=args["max_steps"],
                    n_train=len(args["train_data"]), n_valid=len(args["valid_data"] or []), schedule="warmup_inv_sqrt")
    if args["loss_reduction"] != "sample":
        settings["loss_reduction"] = args["loss_reduction"]
    return settings


class _TrainingRun:
    """Where a ``train`` call stands, and everything around its loop that is not the recipe: the
    history, the progress lines with elapsed time and ETA, and resumable checkpoints.

    ``prog`` is the position: the next step and epoch, the epoch's data order (None = not shuffled yet),
    the start of its next batch, and the epoch's running loss.  With ``checkpoint=path`` the weights,
    Adam's moments and step, ``prog``, the shuffling RNG and the history are written atomically every
    ``checkpoint_every`` seconds, at the end of every epoch, and when the run is interrupted with Ctrl-C
    or SIGTERM (a step interrupted between ``begin_update`` and the end of ``record_step``, while the
    weights, Adam, ``prog`` and the history disagree, is undone first: ``updating``).  Calling
    ``train`` again with the same arguments resumes from the file and, with the same worker count, ends
    with bit-identical weights; a finished run's checkpoint makes the call return at once with the
    trained weights.  A checkpoint of another model configuration, dataset or setting, or a damaged one, raises
    CheckpointMismatchError naming the file and the field (it is checked whole before anything is loaded).
    """

    def __init__(self, model, opt, train_data, valid_data, loss_fn, settings, *, checkpoint, checkpoint_every,
                 log_every, verbose, tag):
        if not train_data:
            raise ValueError("train: train_data is empty")
        if settings["batch_size"] < 1:
            raise ValueError(f"train: batch_size must be >= 1, got {settings['batch_size']}")
        self.model, self.opt, self.n, self.tag, self.verbose = model, opt, len(train_data), tag, verbose
        self.epochs, self.batch_size = settings["epochs"], settings["batch_size"]
        self.rng = random.Random(settings["seed"])                  # shuffles the data each epoch
        per_epoch = math.ceil(self.n / self.batch_size)
        max_steps = settings["max_steps"]
        self.total_steps = per_epoch * self.epochs if max_steps is None else min(max_steps, per_epoch * self.epochs)
        self.log_every = log_every or max(1, per_epoch // 5)
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every
        self.history = {"settings": settings, "steps": [], "epochs": []}
        self.prog = {"step": 0, "epoch": 1, "order": None, "pos": 0, "ep_loss": 0.0, "ep_batches": 0}
        self.updating = None                                        # begin_update's record while a step is half done
        self.fingerprint = _fingerprint(model, settings, loss_fn, train_data, valid_data) if checkpoint else None
        elapsed0 = self._resume() if checkpoint and os.path.exists(checkpoint) else 0.0
        self.t0 = time.perf_counter() - elapsed0
        self.last_save = self.call_t0 = time.perf_counter()
        self.call_step0 = self.prog["step"]                         # the ETA counts only this call's steps

    step = property(lambda self: self.prog["step"], doc="updates done so far")
    epoch = property(lambda self: self.prog["epoch"], doc="the current epoch (1-based)")

    def _resume(self):
        """Load the checkpoint into the model, Adam, the RNG, ``prog`` and the history; returns its elapsed time."""
        limits = {"total_steps": self.total_steps, "n": self.n, "epochs": self.epochs, "batch_size": self.batch_size}
        self.prog, old, elapsed = _load_checkpoint(self.checkpoint, self.fingerprint, self.model, self.opt,
                                                   self.rng, limits)
        self.history["steps"], self.history["epochs"] = old["steps"], old["epochs"]
        self.history["resumed_at_steps"] = old.get("resumed_at_steps", []) + [self.prog["step"]]
        if self.verbose:
            print(f"[{self.tag}] resuming from {self.checkpoint} at step {self.prog['step']}/{self.total_steps}",
                  flush=True)
        return elapsed

    def epoch_batches(self):
        """The batches (lists of sample indices) left in the current epoch; shuffles at the epoch's start."""
        p = self.prog
        if p["order"] is None:                                      # a new epoch: shuffle
            order = list(range(self.n))
            self.rng.shuffle(order)
            p.update(order=order, pos=0, ep_loss=0.0, ep_batches=0)
        order = p["order"]
        for s in range(p["pos"], self.n, self.batch_size):
            if p["step"] >= self.total_steps:
                return
            yield order[s:s + self.batch_size]

    def begin_update(self):
        """Before Adam's update: a copy of what it and ``record_step`` change (the weights and Adam's state,
        ``prog``, the history's length), so that a step interrupted half way can be undone whole."""
        self.updating = (_UpdateUndo(self.opt), dict(self.prog), len(self.history["steps"]))

    def record_step(self, loss, lr, gnorm):
        """After an update: kept unless it left a weight non-finite (then undone: NonFiniteLossError); its
        record and the new position (``updating`` ends), then the log line every ``log_every`` steps and a
        checkpoint every ``checkpoint_every`` seconds."""
        p = self.prog
        step, epoch = p["step"] + 1, p["epoch"]
        self.updating[0].check(step, self.tag)
        self.history["steps"].append({"step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": gnorm})
        p.update(step=step, pos=p["pos"] + self.batch_size, ep_loss=p["ep_loss"] + loss,
                 ep_batches=p["ep_batches"] + 1)
        self.updating = None
        if self.verbose and (step % self.log_every == 0 or step == self.total_steps):
            el = time.perf_counter() - self.t0
            eta = (time.perf_counter() - self.call_t0) / (step - self.call_step0) * (self.total_steps - step)
            print(f"[{self.tag}] epoch {epoch}/{self.epochs} step {step}/{self.total_steps} loss {loss:.4f} "
                  f"lr {lr:.2e} |g| {gnorm:.3f} elapsed {format_time(el)} ETA {format_time(eta)}", flush=True)
        if self.checkpoint and time.perf_counter() - self.last_save >= self.checkpoint_every:
            self.save()

    def end_epoch(self, valid_loss, epoch_fn):
        """The epoch's record (mean train loss, validation loss, ``epoch_fn``'s metrics, elapsed seconds),
        the move to the next epoch, a checkpoint and the log line."""
        p, epoch = self.prog, self.prog["epoch"]
        rec = {"epoch": epoch, "train_loss": p["ep_loss"] / max(1, p["ep_batches"]), "steps": p["step"]}
        if valid_loss is not None:
            rec["valid_loss"] = valid_loss
        if epoch_fn is not None:
            rec.update(epoch_fn(self.model, epoch) or {})
        rec["elapsed"] = time.perf_counter() - self.t0
        self.history["epochs"].append(rec)
        p.update(epoch=epoch + 1, order=None, pos=0)
        if self.checkpoint:
            self.save()
        if self.verbose:
            extra = " ".join(f"{k} {v:.4f}" for k, v in rec.items()
                             if k not in ("epoch", "steps", "elapsed") and isinstance(v, float))
            print(f"[{self.tag}] end of epoch {epoch}/{self.epochs}: {extra} ({format_time(rec['elapsed'])})",
                  flush=True)

    def interrupted(self):
        """Ctrl-C or SIGTERM: undo a step left half done (weights, Adam, position and history as before it),
        save a checkpoint, and say how to resume."""
        if self.updating:
            undo, prog, n_steps = self.updating
            undo.restore()
            self.prog.update(prog)
            del self.history["steps"][n_steps:]
            self.updating = None
        if self.checkpoint:
            self.save()
        where = (f"checkpoint at step {self.step} saved in {self.checkpoint}; run the same command again to "
                 "resume from it") if self.checkpoint else "no checkpoint= was given, so nothing was saved"
        print(f"\n[{self.tag}] interrupted at step {self.step}/{self.total_steps}: {where}", flush=True)

    def save(self):
        _save_checkpoint(self.checkpoint, self.fingerprint, self.model, self.opt, self.rng, self.prog,
                         self.history, time.perf_counter() - self.t0)
        self.last_save = time.perf_counter()

    def finish(self):
        """The history, with the run's wall time and step count."""
        self.history["wall_time"] = time.perf_counter() - self.t0
        self.history["n_steps"] = self.prog["step"]
        return self.history


def format_time(s):
    """Seconds as '3m07s', or '1h05m' from an hour on (progress lines and ETAs)."""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# =====================================================================================
# Generation
# =====================================================================================
# The tutorial treats decoding and the K/V cache in chapter 6, beside the causal model; it is read here,
# after training, because it needs a trained model.
#
# Autoregressive decoding produces one token at a time, each from the logits row after every token so
# far.  ``generate_plain`` is that loop written plainly: a full ``forward`` of the whole sequence for
# every new token (O(T^2) work per token).  ``DecodeState`` computes the same rows, cached: it keeps, per
# layer and head, the K and V rows of every position already seen (K after RoPE), so one step only
# projects the new token and attends over the cache; an EncoderDecoder's memory K/V for cross-attention
# is computed once per source.  ``generate`` runs either loop (the cached one by default) with greedy,
# temperature and top-k choices, decoding constraints and backtracking; beam search and scoring follow.
#
# Inference reads the weights only: the cached path never writes the training caches (Linear.X,
# LayerNorm.XH, MultiHeadAttention.heads, ...), so a ``backward`` pending from an earlier training
# ``forward`` stays correct across any cached decoding.  (``backward`` always differentiates the most
# recent training ``forward`` of that model: the plain path runs ``forward``, which replaces the pending
# graph, exactly as a second call of ``forward`` would.)


def generate_plain(model, prefix, max_new_tokens, pick, *, src=None, eos_id=None, constraint=None):
    """Autoregressive decoding written plainly: recompute everything for every new token.

    Each step runs a full ``forward`` of all the ids so far (an EncoderDecoder: ``decode`` against its
    source, encoded once) and keeps the logits row of the last position; ``pick(row, allowed)`` chooses the
    next id (``generate`` passes argmax or a temperature / top-k draw, ``_pick``), where ``allowed`` is the
    sorted list of ids ``constraint(ids)`` permits, or None for no restriction (a constraint with ``confirm``:
    its candidates, confirmed as ``_choose`` says).  Stops when ``eos_id`` is
    chosen (it is not returned), after ``max_new_tokens``, or when the constraint allows nothing.
    Returns (new ids, reason) with reason "eos", "max_new_tokens" or "no_allowed_token".  A model with
    ``next_logits(ids)`` (an n-gram LM) gives the row itself (``_recomputed_logits``).
    """
    _check_start("generate_plain", model, prefix, src)
    logits_after = _recomputed_logits(model, src)                   # ids -> forward(ids)[-1]
    ids, new = list(prefix), []
    while len(new) < max_new_tokens:
        logits = logits_after(ids)                                  # a full forward: O(T^2) per token
        allowed = _allowed_ids(constraint, ids, len(logits), lazy=True)
        nxt = None if allowed is not None and not allowed else _choose(pick, logits, allowed, constraint, ids)
        if nxt is None:
            return new, "no_allowed_token"
        if eos_id is not None and nxt == eos_id:
            return new, "eos"
        ids.append(nxt)
        new.append(nxt)
    return new, "max_new_tokens"


def _check_start(who, model, prefix, src):
    """ValueError unless decoding has a first token and, for an EncoderDecoder, a non-empty source."""
    if not prefix:
        raise ValueError(f"{who}: the prefix must hold at least one token (e.g. <bos>)")
    if isinstance(model, EncoderDecoder) and (src is None or len(src) == 0):
        raise ValueError(f"{who}: an EncoderDecoder needs a non-empty src (the source ids), got {src!r}")


def _recomputed_logits(model, src):
    """``logits_after(ids)`` of the plain path (``generate_plain``): a full ``forward`` of ids (an
    EncoderDecoder's source is encoded once) through the training path, so it replaces any pending
    backward; a model with ``next_logits(ids)`` (an n-gram LM) gives its own.  A learned position table
    (max_len rows) sees only the last max_len ids, as the cached path reproduces."""
    if hasattr(model, "next_logits"):                               # any next-token model (an n-gram LM)
        return model.next_logits
    s2s = isinstance(model, EncoderDecoder)
    memory = model.encode(src) if s2s else None
    limit = model.max_len if (model.tgt_embed if s2s else model.embed).pos == "learned" else None

    def logits_after(ids):
        window = ids[-limit:] if limit else ids
        return (model.decode(window, memory) if s2s else model.forward(window))[-1]
    return logits_after


class ConstraintError(ValueError):
    """A decoding constraint answered with something that is not a token id of the model's vocabulary
    (``.token_id``: the offending value)."""

    def __init__(self, token_id, vocab_size, tokens):
        self.token_id = token_id
        super().__init__(f"the decoding constraint allowed {token_id!r} after {list(tokens)[-8:]!r} (the last 8 "
                         f"tokens), which is not a token id of this vocabulary (0..{vocab_size - 1})")


def _allowed_ids(constraint, tokens, vocab_size, lazy=False):
    """The constraint hook's answer as a sorted list of ids, or None for no restriction; ConstraintError
    for an answer that is not an id in 0..vocab_size-1.  ``lazy`` (the decoding loops): a constraint with a
    ``confirm`` method answers with ``constraint.candidates(tokens)``, a superset whose ids ``_choose``
    confirms one at a time, only those a draw may need."""
    if constraint is None:
        return None
    allowed = constraint.candidates(tokens) if lazy and hasattr(constraint, "confirm") else constraint(tokens)
    if allowed is None:
        return None
    ids = set()
    for i in allowed:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < vocab_size:
            raise ConstraintError(i, vocab_size, tokens)
        ids.add(int(i))
    return sorted(ids)


def _choose(pick, logits, allowed, constraint, ids, banned=()):
    """The next id: ``pick(logits, allowed)``.  A constraint that listens for refusals (one with a ``refused``
    method, e.g. a SmilesConstraint told to close a molecule when the model asks to end it) is first offered
    the model's own choice over the whole vocabulary: one it allows is kept; one it refuses is reported,
    ``constraint.refused(ids, choice)`` (after which it may allow less), and the choice is drawn again among
    what it allows then (less ``banned``, backtracking's ruled-out ids).  Without a top-k cut, over the
    allowed ids this is the distribution ``pick`` gives among them directly (a refused draw is redrawn within
    them); with one, the first draw's cut is over the whole vocabulary.  A constraint with ``confirm`` (its
    answer ``candidates``, a superset) has its ids confirmed as ``_pick_confirmed`` needs them, when ``pick``
    says its rank cut (``pick.top``, as ``generate``'s does); any other ``pick`` gets every candidate confirmed
    first (a rank cut it does not declare would make the lazy draw differ).  None: nothing is allowed."""
    confirm = getattr(constraint, "confirm", None) if allowed is not None else None
    if confirm is not None and not any(confirm(ids, i) for i in sorted(allowed, key=lambda i: (-logits[i], i))):
        return None                  # no candidate passes: a dead end, with no draw and no refusal (as masked first)
    if allowed is not None and hasattr(constraint, "refused"):
        first = pick(logits, None)                                   # the model's own choice
        if first in set(allowed) and (confirm is None or confirm(ids, first)):
            return first
        constraint.refused(ids, first)
        allowed = _allowed_ids(constraint, ids, len(logits), lazy=True)
        if allowed is None:                                          # it restricts nothing any more
            return first
        allowed = [i for i in allowed if i not in banned]
        if not allowed:
            return None
    if confirm is None:
        return pick(logits, allowed)
    if not hasattr(pick, "top"):                                     # a pick of unknown rank cut: confirm all
        allowed = [i for i in allowed if confirm(ids, i)]
        return pick(logits, allowed) if allowed else None
    return _pick_confirmed(pick, logits, allowed, lambda i: confirm(ids, i))


def _pick_confirmed(pick, logits, candidates, ok):
    """``pick(logits, [i in candidates if ok(i)])``, calling ``ok`` (a costly check) on as few ids as the draw
    needs, with the same distribution.  With a rank cut (``pick.top``: 1 for greedy, k for top-k) the
    candidates are checked in logit order (ties by id) until ``top`` pass, and ``pick`` draws among those:
    the very draw (the same ids, the same random number) it makes over the checked list.  Without one,
    rejection: a draw that fails ``ok`` is removed and the draw repeated among the rest; the chance of an id
    is then p_i / (sum of p over the ids that pass), the masked softmax (each redraw renormalises over what is
    left, and every failing id drawn is removed).  None if no candidate passes."""
    top = getattr(pick, "top", None)
    if top is not None:
        kept = []
        for i in sorted(candidates, key=lambda i: (-logits[i], i)):
            if ok(i):
                kept.append(i)
                if len(kept) == top:
                    break
        return pick(logits, sorted(kept)) if kept else None
    cand = list(candidates)
    while cand:
        i = pick(logits, cand)
        if ok(i):
            return i
        cand.remove(i)
    return None


def _pick(logits, greedy, temperature, top_k, rng, allowed=None):
    """Next token from one row of logits: argmax, or a draw from softmax(logits / T) over the top k;
    ``allowed`` (sorted ids) restricts the choice (the decoding constraint)."""
    ids = range(len(logits)) if allowed is None else allowed
    if greedy:
        return max(ids, key=logits.__getitem__)                          # first index of the maximum
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    cand = sorted(ids, key=lambda i: (-logits[i], i))                    # by logit, ties by index
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        cand = cand[:top_k]
    p = softmax_rows([[logits[i] / temperature for i in cand]])[0]
    u, acc = rng.random(), 0.0
    for i, pi in zip(cand, p):
        acc += pi
        if u < acc:
            return i
    return cand[-1]


# --- The same, cached ---------------------------------------------------------------------------------


def _encode_inference(model, src):
    """An EncoderDecoder's encoder memory (S, d) and its key_padding_mask, without training caches."""
    mask = padding_mask(src, model.src_pad_id)
    X = model.src_embed.apply(src)
    for b in model.enc_blocks:
        X = b.apply(X, key_padding_mask=mask)
    return model.enc_ln.apply(X), mask


class DecodeState:
    """The plain path's logits rows, cached: one sequence being decoded, its token ids so far and every
    layer's self-attention K/V cache (``_generate_cached`` is ``generate_plain`` with one of these).

    ``tokens`` holds every id so far (prefix included); ``logits`` is the next-token row after the last
    one.  ``step(id)`` appends a token and returns the new ``logits``; ``feed(ids)`` appends several in
    one pass and returns their rows (n, V); ``truncate(n)`` undoes them back to the first n tokens (how
    constrained sampling backtracks); ``copy()`` branches cheaply (the cached rows are shared, never
    mutated; only the per-head row lists are copied), which is how beam search forks hypotheses.

    Positions: new rows are placed at their absolute offsets (sine and learned rows, RoPE angles).  A
    learned position table that runs out (more than ``max_len`` tokens) behaves as the plain path does:
    the logits are those of the last ``max_len`` tokens, recomputed from scratch at every further step.
    """

    def __init__(self, model, prefix=(), *, src=None):
        if isinstance(model, EncoderDecoder):
            if src is None or len(src) == 0:
                raise ValueError(f"DecodeState: an EncoderDecoder needs a non-empty src (the source ids), got {src!r}")
            memory, self._src_mask = _encode_inference(model, src)
            self._emb, self._blocks, self._ln = model.tgt_embed, model.dec_blocks, model.dec_ln
            self._cross = [b.cross_attn.memory_kv(memory) for b in self._blocks]   # once per source
        elif isinstance(model, TransformerLM):
            if src is not None:
                raise ValueError("DecodeState: a TransformerLM takes no src")
            self._emb, self._blocks, self._ln = model.embed, model.blocks, model.ln_f
            self._cross, self._src_mask = [None] * len(model.blocks), None
        else:
            raise TypeError(f"DecodeState: cannot decode with a {type(model).__name__}")
        self.model = model
        self._limit = model.max_len if self._emb.pos == "learned" else None
        self._reset()
        self.tokens, self.logits = [], None
        self._rows = []                                                  # the logits row after each token
        if prefix:
            self.feed(list(prefix))

    def _reset(self):
        self._cache = [b.self_attn.new_cache() for b in self._blocks]
        self._pos = 0                                                    # positions held in the cache

    def _run(self, ids):
        """Run new ids through the model at positions self._pos.. and return their logits (n, V)."""
        X = self._emb.apply(ids, self._pos)                              # (n, d)
        for b, cache, mem in zip(self._blocks, self._cache, self._cross):
            X = b.step(cache, X, mem, self._src_mask)
        self._pos += len(ids)
        Hs = self._ln.apply(X)
        m = self.model
        if isinstance(m, TransformerLM) and m.tie_weights:
            return matmul_nt(Hs, m.embed.tok.W.data)                     # logits = H E^T
        return m.head.apply(Hs)

    def feed(self, ids):
        """Append ``ids`` (one pass) and return their logits rows (n, V); ``logits`` becomes the last row."""
        ids = list(ids)
        if not ids:
            raise ValueError("DecodeState.feed: no ids")
        self.tokens += ids
        if self._limit is not None and self._pos + len(ids) > self._limit:
            self._reset()                                                # learned table ran out: crop
            rows = self._run(self.tokens[-self._limit:])
        else:
            rows = self._run(ids)
        self._rows += [None] * (len(ids) - len(rows)) + rows[-len(ids):]   # None: cropped away, never computed
        self.logits = rows[-1]
        return rows

    def step(self, token_id):
        """Append one token; returns the next-token logits row (V,)."""
        return self.feed([token_id])[-1]

    def truncate(self, n):
        """Keep the first ``n`` tokens (1 <= n <= len(tokens)) and return ``logits``, the row after them,
        as if the later ones had never been fed.  The cached K/V rows beyond n are dropped; a learned table
        that ran out is rebuilt from the last max_len tokens, as the plain path would crop them."""
        if not 1 <= n <= len(self.tokens):
            raise ValueError(f"DecodeState.truncate: n must be in 1..{len(self.tokens)}, got {n}")
        cropped = self._pos != len(self.tokens)                          # the learned table ran out
        self.tokens = self.tokens[:n]
        del self._rows[n:]
        if cropped:
            self._reset()
            rows = self._run(self.tokens[-self._limit:])
            if n <= self._limit:
                self._rows = rows                                        # the whole prefix, uncropped
            else:
                self._rows[-1] = rows[-1]                                # the plain path's cropped row
        else:
            for layer in self._cache:
                for K, V in layer:                                       # our own row lists (copy() copies them)
                    del K[n:], V[n:]
            self._pos = n
        self.logits = self._rows[-1]
        return self.logits

    def copy(self):
        new = object.__new__(DecodeState)
        new.__dict__.update(self.__dict__)
        new.tokens = list(self.tokens)
        new._rows = list(self._rows)
        new._cache = [[[list(K), list(V)] for K, V in layer] for layer in self._cache]
        return new


def start_decode(model, prefix, *, src=None):
    """Start incremental decoding: one pass over ``prefix`` (and, for an EncoderDecoder, one encoding of
    ``src``).  Returns a DecodeState whose ``logits`` is the next-token row after the prefix."""
    _check_start("start_decode", model, prefix, src)
    return DecodeState(model, prefix, src=src)


def _generate_cached(model, prefix, max_new_tokens, pick, *, src=None, eos_id=None, constraint=None):
    """``generate_plain`` with a DecodeState: the prefix (and source) in one pass, then one cached step per
    new token.  The same rows, choices and stops as the plain loop, token for token; returns (new ids, reason)."""
    state = start_decode(model, prefix, src=src)                    # the prefix (and src) in one pass
    new = []
    while len(new) < max_new_tokens:
        logits = state.step(new[-1]) if new else state.logits       # one cached step per new token
        allowed = _allowed_ids(constraint, state.tokens, len(logits), lazy=True)
        nxt = (None if allowed is not None and not allowed else
               _choose(pick, logits, allowed, constraint, state.tokens))
        if nxt is None:
            return new, "no_allowed_token"
        if eos_id is not None and nxt == eos_id:
            return new, "eos"
        new.append(nxt)
    return new, "max_new_tokens"


# --- generate, greedy_decode and sample: one entry point for every choice rule ------------------------


def _check_decoding_args(max_new_tokens, greedy, temperature, top_k, backtrack, who="generate"):
    """TypeError / ValueError naming the argument and its value: counts are ints (not bools) >= 0
    (top_k >= 1 or None), and a sampling temperature is a finite number > 0."""
    for name, value, low in (("max_new_tokens", max_new_tokens, 0), ("backtrack", backtrack, 0),
                             ("top_k", top_k, 1)):
        if value is None and name == "top_k":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{who}: {name} must be an int, got {value!r} ({type(value).__name__})")
        if value < low:
            raise ValueError(f"{who}: {name} must be >= {low}, got {value}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"{who}: temperature must be a number, got {temperature!r} ({type(temperature).__name__})")
    if not greedy and not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{who}: temperature must be a finite number > 0 for sampling, got {temperature}")


def generate(model, prefix, max_new_tokens, *, src=None, greedy=False, temperature=1.0, top_k=None,
             rng=None, eos_id=None, constraint=None, backtrack=0, use_cache=True, return_reason=False):
    """Autoregressive decoding for a TransformerLM (``prefix`` = start ids) or an EncoderDecoder
    (``src`` = source ids, ``prefix`` = e.g. [bos]).

    Greedy (argmax) or sampling with temperature and top-k (``_pick``), drawn from ``rng`` (a
    random.Random or an int seed; default seed 0; the global RNG is never used).  ``constraint(tokens)``
    (tokens = every id so far, prefix included) may return the allowed next ids (None = no restriction);
    the others are never chosen.  Stops after ``max_new_tokens``, when ``eos_id`` is produced (eos is not
    returned), or when the constraint allows nothing.  Returns the new ids, or (ids, reason) with
    ``return_reason``: reason is "eos", "max_new_tokens" or "no_allowed_token".

    ``backtrack=n`` undoes up to n dead ends the constraint could not foresee (``_generate_backtracking``).
    ``use_cache=True`` decodes incrementally with a DecodeState (K/V cache; the training caches are not
    touched); ``use_cache=False`` is the plain recompute of ``generate_plain``, which the cached path
    reproduces token for token.  Any other object with ``next_logits(ids)`` (the next-token row after
    ids, e.g. an n-gram LM) decodes through the plain path with the same choices.
    """
    _check_start("generate", model, prefix, src)
    _check_decoding_args(max_new_tokens, greedy, temperature, top_k, backtrack)
    if rng is None or isinstance(rng, int):
        rng = random.Random(0 if rng is None else rng)
    def pick(logits, allowed):
        return _pick(logits, greedy, temperature, top_k, rng, allowed)
    pick.top = 1 if greedy else top_k             # the rank cut _pick_confirmed checks candidates up to
    use_cache = use_cache and not hasattr(model, "next_logits")   # a model with next_logits(ids): plain path
    if backtrack:
        logits_after = _cached_logits(model, prefix, src) if use_cache else _recomputed_logits(model, src)
        new, reason = _generate_backtracking(logits_after, prefix, max_new_tokens, pick, eos_id, constraint,
                                             backtrack)
    else:
        loop = _generate_cached if use_cache else generate_plain
        new, reason = loop(model, prefix, max_new_tokens, pick, src=src, eos_id=eos_id, constraint=constraint)
    return (new, reason) if return_reason else new


def greedy_decode(model, prefix, max_new_tokens, *, src=None, eos_id=None, constraint=None, backtrack=0,
                  use_cache=True, return_reason=False):
    """Greedy decoding: ``generate`` with argmax at every step."""
    return generate(model, prefix, max_new_tokens, src=src, greedy=True, eos_id=eos_id, constraint=constraint,
                    backtrack=backtrack, use_cache=use_cache, return_reason=return_reason)


def sample(model, prefix, max_new_tokens, *, src=None, temperature=1.0, top_k=None, rng=None, eos_id=None,
           constraint=None, backtrack=0, use_cache=True, return_reason=False):
    """Sampling with temperature and top-k: ``generate`` with greedy=False."""
    return generate(model, prefix, max_new_tokens, src=src, temperature=temperature, top_k=top_k, rng=rng,
                    eos_id=eos_id, constraint=constraint, backtrack=backtrack, use_cache=use_cache,
                    return_reason=return_reason)


# --- Backtracking: undoing dead ends the constraint could not foresee ---------------------------------


def _generate_backtracking(logits_after, prefix, max_new_tokens, pick, eos_id, constraint, backtrack):
    """``generate`` with ``backtrack=n``: when the constraint allows nothing (a dead end it could not
    foresee), undo the last new token, rule it out at that position and choose again among the remaining
    allowed ids, at most n times per sequence; a position with nothing left backs up further.  The
    sequence stops with "no_allowed_token" only when the n undos are spent or the first new position has
    run out.  (Greedy with backtracking is a depth-first search in logit order.)

    ``logits_after(ids)`` (``_cached_logits`` or ``_recomputed_logits``) gives the next-token row after
    ``ids``; it is asked once per visit of a new position: after an undo the kept positions' rows are
    reused, and the next call's ids are the kept ones plus the new choice.  Returns (new ids, reason).
    """
    ids, new, undos = list(prefix), [], backtrack
    rows, banned = [], []          # per new position: its logits row and the ids ruled out there
    while len(new) < max_new_tokens:
        if len(rows) == len(new):                                   # a new position: its logits row
            rows.append(logits_after(ids))
            banned.append(set())
        allowed = _allowed_ids(constraint, ids, len(rows[-1]), lazy=True)
        if allowed is not None and banned[-1]:
            allowed = [i for i in allowed if i not in banned[-1]]
        nxt = (None if allowed is not None and not allowed else
               _choose(pick, rows[-1], allowed, constraint, ids, banned[-1]))
        if nxt is None:
            if undos == 0 or not new:
                return new, "no_allowed_token"
            undos -= 1                                              # back up one token and choose again
            rows.pop()
            banned.pop()
            banned[-1].add(new.pop())
            ids.pop()
            continue
        if eos_id is not None and nxt == eos_id:
            return new, "eos"
        ids.append(nxt)
        new.append(nxt)
    return new, "max_new_tokens"


def _cached_logits(model, prefix, src):
    """``logits_after(ids)`` through one DecodeState, for ``_generate_backtracking``.  The first call's ids
    are the prefix; every later call's ids are a prefix of the ids the state holds plus one new token:
    the state is truncated back to that prefix (the undone tokens) and takes one cached step."""
    state = start_decode(model, prefix, src=src)

    def logits_after(ids):
        if len(ids) == len(prefix):
            return state.logits                                     # the first call: the row after the prefix
        if len(state.tokens) >= len(ids):
            state.truncate(len(ids) - 1)                            # drop the undone tokens
        return state.step(ids[-1])
    return logits_after


# --- Scoring and beam search --------------------------------------------------------------------------


def log_softmax(row):
    """log softmax of one row, max-subtracted: z_i - (m + log sum_j exp(z_j - m)).  -inf entries stay -inf."""
    m = max(row)
    if m == -math.inf:
        return [-math.inf] * len(row)
    exp = math.exp
    lse = m + math.log(sum(exp(z - m) for z in row))
    return [z - lse for z in row]


def sequence_logprob(model, ids, *, src=None):
    """log p(ids[1:] | ids[0]) = sum over t >= 1 of log_softmax(logits after ids[:t])[ids[t]], in one pass.

    For an EncoderDecoder ``ids`` is the target sequence starting with its <bos> and ``src`` the source."""
    if len(ids) < 2:
        raise ValueError(f"sequence_logprob: need at least 2 ids (a start token and one scored), got {len(ids)}")
    st = DecodeState(model, src=src)
    if st._limit is not None and len(ids) - 1 > st._limit:
        raise ShapeError(f"sequence_logprob: {len(ids) - 1} input positions exceed the learned position "
                         f"table (max_len={st._limit})")
    rows = st.feed(ids[:-1])                                             # (T-1, V)
    return sum(log_softmax(r)[y] for r, y in zip(rows, ids[1:]))


class Hypothesis(tuple):
    """A beam-search result: unpacks as (ids, logprob, score); also ``.finished`` (ended with eos) and
    ``.reason`` ("eos", "max_new_tokens" or "no_allowed_token")."""

    def __new__(cls, ids, logprob, score, reason):
        h = super().__new__(cls, (ids, logprob, score))
        h.reason = reason
        return h

    @classmethod
    def scored(cls, ids, logprob, reason, length_penalty):
        """score = logprob / n ** length_penalty, n = the scored tokens (eos included when it ended there)."""
        n = len(ids) + (reason == "eos")
        return cls(list(ids), logprob, logprob / n ** length_penalty if n else logprob, reason)

    ids = property(lambda self: self[0])
    logprob = property(lambda self: self[1])
    score = property(lambda self: self[2])
    finished = property(lambda self: self.reason == "eos")


def beam_search(model, prefix, width, max_new_tokens, *, src=None, eos_id=None, length_penalty=1.0,
                constraint=None):
    """Beam search over the model's next-token distribution; returns up to ``width`` Hypothesis tuples
    (ids, logprob, score), best first.

    ``ids`` are the new tokens (eos excluded); ``logprob`` is the sum of log_softmax(logits)[token] over the
    scored tokens (eos included when the hypothesis finished), i.e. the model's log-probability of that
    continuation, unrenormalised by the constraint; ``score = logprob / n ** length_penalty`` with n the
    number of scored tokens (length_penalty 0: raw log-probability; 1: mean log-probability per token).

    Each step expands every live beam by every allowed token and ranks the candidates by logprob (ties:
    by the token sequence, so the result is deterministic).  A candidate ending in eos among the first
    ``width`` ranks is set aside as finished; the best ``width`` others stay live.  The search stops when
    ``width`` hypotheses have finished, no beam is live, or after ``max_new_tokens``.  The result lists the
    finished hypotheses by score, then (if fewer than ``width`` finished) the unfinished ones by score.
    A beam whose constraint allows nothing ends with reason "no_allowed_token".  Width 1 is greedy decoding.
    The arguments are checked as ``generate`` checks them (TypeError / ValueError naming the argument and
    its value), plus width (an int >= 1) and length_penalty (a finite number).
    """
    _check_beam_args(model, prefix, src, width, max_new_tokens, length_penalty)
    def hyp(ids, lp, reason):
        return Hypothesis.scored(ids, lp, reason, length_penalty)
    live = [(0.0, [], start_decode(model, prefix, src=src))]            # (logprob, new ids, state)
    finished, stopped = [], []
    for t in range(max_new_tokens):
        cand = []
        for lp, ids, st in live:
            allowed = _allowed_ids(constraint, st.tokens, len(st.logits))
            if allowed is not None and not allowed:
                stopped.append(hyp(ids, lp, "no_allowed_token"))
                continue
            row = log_softmax(st.logits)
            for tok in (range(len(row)) if allowed is None else allowed):
                cand.append((lp + row[tok], ids + [tok], st))
        cand.sort(key=lambda c: (-c[0], c[1]))
        live = []
        for rank, (lp, ids, st) in enumerate(cand):
            if eos_id is not None and ids[-1] == eos_id:
                if rank < width:
                    finished.append(hyp(ids[:-1], lp, "eos"))
            elif len(live) < width:
                live.append((lp, ids, st))
            if len(live) == width and rank >= width - 1:
                break
        if len(finished) >= width or not live:
            break
        if t + 1 < max_new_tokens:                                       # advance the survivors' caches
            live = [(lp, ids, _branch(st, live, i, ids[-1])) for i, (lp, ids, st) in enumerate(live)]
    stopped += [hyp(ids, lp, "max_new_tokens") for lp, ids, _ in live]
    def order(h):
        return (-h.score, -h.logprob, h.ids)
    return (sorted(finished, key=order) + sorted(stopped, key=order))[:width]


def _check_beam_args(model, prefix, src, width, max_new_tokens, length_penalty):
    """beam_search's arguments, checked as generate checks its own (``_check_start``,
    ``_check_decoding_args``), plus width an int >= 1 and length_penalty a finite number."""
    _check_start("beam_search", model, prefix, src)
    _check_decoding_args(max_new_tokens, True, 1.0, None, 0, who="beam_search")
    if isinstance(width, bool) or not isinstance(width, int):
        raise TypeError(f"beam_search: width must be an int >= 1, got {width!r} ({type(width).__name__})")
    if width < 1:
        raise ValueError(f"beam_search: width must be >= 1, got {width}")
    if not _real(length_penalty):
        raise TypeError(f"beam_search: length_penalty must be a number, got {length_penalty!r}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"beam_search: length_penalty must be a finite number, got {length_penalty!r}")


def _branch(state, live, i, token):
    """The state of live[i] advanced by ``token``: a copy if a later beam shares the same parent state."""
    shared = any(st is state for _, _, st in live[i + 1:])
    st = state.copy() if shared else state
    st.step(token)
    return st


# =====================================================================================
# Gradient checking
# =====================================================================================
# The tutorial's chapter 7 proves each backward this way: central differences against every hand-written
# backward, passing an entry when its relative OR its absolute error is small.  It comes after the recipe
# it verifies; tests_transformer.py runs it on every layer and model.


def numerical_grad(f, param, eps=1e-4):
    """Central differences (f(theta + eps) - f(theta - eps)) / (2 eps) for every entry of ``param``.

    ``f()`` recomputes the scalar loss from the current parameter values; ``param`` is a Param (or a
    matrix/vector) that is perturbed in place and restored exactly.  Returns an array of param's shape.
    """
    data = param.data if isinstance(param, Param) else param
    rows = data if data and isinstance(data[0], list) else [data]
    out = []
    for r in rows:
        g = [0.0] * len(r)
        for j in range(len(r)):
            old = r[j]
            r[j] = old + eps
            fp = f()
            r[j] = old - eps
            fm = f()
            r[j] = old
            g[j] = (fp - fm) / (2.0 * eps)
        out.append(g)
    return out if rows is data else out[0]


def grad_ok(analytic, numeric, rel_tol=1e-5, abs_tol=1e-8):
    """Pass if the relative error < rel_tol OR the absolute error < abs_tol (one entry)."""
    err = abs(analytic - numeric)
    if err < abs_tol:
        return True
    return err / max(abs(analytic), abs(numeric)) < rel_tol


def gradient_check(loss_fn, params, eps=1e-4, rel_floor=1e-6):
    """Check every entry of every Param against central differences.

    ``loss_fn(backward)`` runs the forward pass and returns the scalar loss; with backward=True it
    also back-propagates, adding into Param.grad.  Returns a report: number of entries, number failing
    ``grad_ok``, max absolute error, and max relative error over the entries with |grad| >= rel_floor
    (below that the relative error of two near-zero numbers says nothing), per Param and overall.
    """
    for p in params:
        p.zero_grad()
    loss_fn(True)
    analytic = {id(p): [list(r) for r in p.rows("grad")] for p in params}
    report = {"n_params": 0, "n_failed": 0, "max_abs_err": 0.0, "max_rel_err": 0.0, "per_param": {}}
    for p in params:
        num = numerical_grad(lambda: loss_fn(False), p, eps)
        num_rows = num if num and isinstance(num[0], list) else [num]
        pa, pr, pf = 0.0, 0.0, 0
        for ar, nr in zip(analytic[id(p)], num_rows):
            for a, nu in zip(ar, nr):
                err = abs(a - nu)
                pa = max(pa, err)
                scale = max(abs(a), abs(nu))
                if scale >= rel_floor:
                    pr = max(pr, err / scale)
                if not grad_ok(a, nu):
                    pf += 1
        report["per_param"][p.name] = {"size": p.size(), "max_abs_err": pa, "max_rel_err": pr, "n_failed": pf}
        report["n_params"] += p.size()
        report["n_failed"] += pf
        report["max_abs_err"] = max(report["max_abs_err"], pa)
        report["max_rel_err"] = max(report["max_rel_err"], pr)
    report["ok"] = report["n_failed"] == 0
    return report


# =====================================================================================
# Counting
# =====================================================================================
# The tutorial's chapter 7 counts a model's parameters in closed form; here they are counted two ways, by
# walking the model and from its config, and the two must agree.


def param_count(model):
    """Number of scalar parameters (a tied matrix counts once)."""
    return sum(p.size() for p in model.params())


def param_count_formula(model):
    """The closed-form parameter count from a model's config (must equal ``param_count``):
    token embedding V d (+ k d for token features); learned positions max_len d (sine, rope, none: 0);
    per layer attention 4(d^2 + d), FFN 2 d d_ff + d_ff + d, LayerNorms 2d each; final LayerNorm 2d;
    head d n_out + n_out (untied)."""
    if type(model).__name__ not in MODEL_CLASSES:
        raise TypeError(f"param_count_formula: no formula for {type(model).__name__}")
    return _config_param_count(type(model).__name__, model.config)


def _config_param_count(cls_name, c):
    """param_count_formula from a class name and a complete config (every constructor argument)."""
    d, f, L = c["d_model"], c["d_ff"], c["n_layers"]
    attn, ffn, ln = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
    pos = c["max_len"] * d if c["pos"] == "learned" else 0
    if cls_name == "TransformerEncoder":
        feat = len(c["token_features"][0]) * d if c.get("token_features") else 0      # W_f (k, d)
        return (c["vocab_size"] * d + feat + pos + L * (attn + ffn + 2 * ln) + ln
                + d * c["n_out"] + c["n_out"])
    if cls_name == "TransformerLM":
        V = c["vocab_size"]
        head = 0 if c["tie_weights"] else d * V + V
        return V * d + pos + L * (attn + ffn + 2 * ln) + ln + head
    Vs, Vt = c["src_vocab_size"], c["tgt_vocab_size"]                                # EncoderDecoder
    enc = Vs * d + pos + L * (attn + ffn + 2 * ln) + ln
    dec = Vt * d + pos + L * (2 * attn + ffn + 3 * ln) + ln
    return enc + dec + d * Vt + Vt


# #####################################################################################
# PART II: THE PLUMBING
# #####################################################################################
# Everything the library needs around the recipe that teaches nothing about Transformers: the checks
# train runs on its arguments and samples, SIGTERM and non-finite steps, checkpoint files and resuming,
# the forked worker processes behind train's batches and parallel_map, and model files.  A learner may
# skip it: Part I calls into it through a few named functions (_check_train_args, _check_loss_reduction,
# _usable_workers, _runner, _mean_of, sigterm_as_ctrl_c, _non_finite_loss, _UpdateUndo, _fingerprint,
# _save_checkpoint, _load_checkpoint, and _real for the decoding arguments).


# =====================================================================================
# Guards: the arguments and samples train checks at entry, a non-finite step, SIGTERM
# =====================================================================================
# A mistake in an argument or a sample is named where it enters (the argument and its value, the sample's
# index), before any work.  A step whose loss or gradient norm is not finite is refused before the update,
# and an update that leaves a weight non-finite is undone: NonFiniteLossError names the step and the
# batch's samples whose loss is not finite, and the weights and Adam's state stay those of the last good
# step.  SIGTERM (a job manager, ``kill``) stops train as Ctrl-C does: checkpoint saved, KeyboardInterrupt.


class NonFiniteLossError(FloatingPointError):
    """``train`` stopped at a step whose loss, gradient or updated weights were not finite.  ``.step`` is
    the step and ``.samples`` the indices (into train_data) of the batch's samples whose own loss is not
    finite; the model and Adam hold the state after the last good step."""

    def __init__(self, message, step, samples=()):
        super().__init__(message)
        self.step, self.samples = step, list(samples)


def _real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_train_args(train_data, valid_data, loss_fn, *, lr, clip, weight_decay, betas, warmup):
    """TypeError / ValueError naming the argument and its value unless: lr is a finite number > 0 (lr <= 0
    would climb the loss), clip None or a finite number > 0, weight_decay a finite number >= 0, warmup a
    finite number >= 0, and betas two finite numbers in [0, 1); then every sample is checked for the loss
    function (``_check_train_data``)."""
    rules = (("lr", lr, lambda v: v > 0, "a finite number > 0"),
             ("clip", clip, lambda v: v > 0, "None or a finite number > 0"),
             ("weight_decay", weight_decay, lambda v: v >= 0, "a finite number >= 0"),
             ("warmup", warmup, lambda v: v >= 0, "a finite number >= 0 (steps)"))
    for name, value, ok, what in rules:
        if name == "clip" and value is None:
            continue
        if not _real(value):
            raise TypeError(f"train: {name} must be {what}, got {value!r} ({type(value).__name__})")
        if not (math.isfinite(value) and ok(value)):
            raise ValueError(f"train: {name} must be {what}, got {value!r}")
    pair = list(betas) if isinstance(betas, (list, tuple)) else None
    if pair is None or len(pair) != 2:
        raise TypeError(f"train: betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(pair):
        if not (_real(b) and math.isfinite(b) and 0 <= b < 1):
            raise ValueError(f"train: betas[{i}] must be a finite number in [0, 1), got {b!r}")
    _check_train_data(train_data, loss_fn, "train_data")
    _check_train_data(valid_data or [], loss_fn, "valid_data")


def _check_loss_reduction(loss_reduction, loss_fn):
    """ValueError unless loss_reduction is "sample" or "token"; TypeError naming the loss function when
    "token" is asked of a loss_fn that takes no ``reduction`` keyword (regression_loss, a custom one)."""
    import inspect
    if loss_reduction not in ("sample", "token"):
        raise ValueError(f"train: loss_reduction must be 'sample' or 'token', got {loss_reduction!r}")
    if loss_reduction == "token":
        params = inspect.signature(loss_fn).parameters
        if "reduction" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TypeError(f"train: loss_reduction='token' needs a loss_fn taking reduction='sum' (lm_loss, "
                            f"seq2seq_loss); {_callable_name(loss_fn)} takes none")


def _lm_sample_problem(sample):
    if isinstance(sample, tuple):
        if len(sample) != 2 or len(sample[0]) != len(sample[1]) or not sample[0]:
            return "is not an (inputs, targets) pair of equal, non-zero lengths"
        return None
    if len(sample) < 2:
        return (f"has {len(sample)} token(s); a language-model sequence needs at least 2 (the inputs are "
                "ids[:-1], the next-token targets ids[1:])")
    return None


def _seq2seq_sample_problem(sample):
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        return "is not a (src, tgt) pair"
    if not sample[0]:
        return "has an empty source"
    if len(sample[1]) < 2:
        return (f"has a target of {len(sample[1])} token(s); it needs at least 2 (the decoder reads "
                "tgt[:-1] and predicts tgt[1:], e.g. bos ... eos)")
    return None


def _regression_sample_problem(sample):
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        return "is not an (ids, y) pair"
    if not sample[0]:
        return "has no tokens"
    y = sample[1]
    if not all(_real(v) and math.isfinite(v) for v in (y if isinstance(y, (list, tuple)) else [y])):
        return f"has the target y = {y!r}; targets must be finite numbers"
    return None


def _check_train_data(data, loss_fn, which):
    """ValueError naming the sample (``which[i]``) that cannot be a sample of ``loss_fn``: lm_loss needs at
    least 2 ids, seq2seq_loss a non-empty source and a target of at least 2 ids, regression_loss tokens and
    finite targets.  Other loss functions (and partials of them) are not checked here."""
    base = getattr(loss_fn, "func", loss_fn)
    problem_of = {lm_loss: _lm_sample_problem, seq2seq_loss: _seq2seq_sample_problem,
                  regression_loss: _regression_sample_problem}.get(base)
    if problem_of is None:
        return
    for i, sample in enumerate(data):
        problem = problem_of(sample)
        if problem:
            raise ValueError(f"train: {which}[{i}] {problem} ({base.__name__})")


def _non_finite_parts(sample):
    """' (its target ...)' when a sample's target holds a number that is not finite, else ''."""
    if isinstance(sample, tuple) and len(sample) == 2:
        y = sample[1]
        vals = y if isinstance(y, (list, tuple)) else [y]
        if any(_real(v) and not math.isfinite(v) for v in vals):
            return f" (its target {y!r})"
    return ""


def _non_finite_loss(step, loss, gnorm, model, loss_fn, data, batch, tag):
    """The NonFiniteLossError of a step whose batch loss or gradient norm is not finite, naming the step
    and the batch's samples whose own loss is not finite (found by a forward pass of each)."""
    bad = [i for i in batch if not math.isfinite(loss_fn(model, data[i], backward=False))]
    if bad:
        detail = "the loss is not finite for " + ", ".join(f"train_data[{i}]{_non_finite_parts(data[i])}"
                                                            for i in bad[:10])
    else:
        detail = "every sample's own loss is finite, the batch's gradient is not"
    return NonFiniteLossError(f"[{tag}] loss {loss}, gradient norm {gnorm} at step {step}: {detail}; nothing "
                              f"was updated: the weights and Adam's state are those after step {step - 1}",
                              step, bad)


def _array_rows(arrays):
    """The rows of a list of matrices and vectors (a vector is one row): the lists an update changes."""
    return [r for a in arrays for r in (a if a and isinstance(a[0], list) else [a])]


class _UpdateUndo:
    """A copy of the weights and of Adam's t, m and v, taken before an update.  ``restore`` puts it back;
    ``check`` keeps the update when every weight is finite, otherwise (a learning rate too large for
    float64) restores the copy and raises NonFiniteLossError, so a failed step changes nothing."""

    def __init__(self, opt):
        self.opt, self.t = opt, opt.t
        self.rows = [list(r) for r in self._live_rows()]

    def _live_rows(self):
        return _array_rows([p.data for p in self.opt.params]) + _array_rows(self.opt.m) + _array_rows(self.opt.v)

    def restore(self):
        for live, saved in zip(self._live_rows(), self.rows):
            live[:] = saved
        self.opt.t = self.t

    def check(self, step, tag):
        if math.isfinite(sum(map(sum, _array_rows([p.data for p in self.opt.params])))):
            return                                          # a sum is finite only when every entry is
        self.restore()
        raise NonFiniteLossError(f"[{tag}] the update of step {step} made a weight non-finite (is lr too large?); "
                                 f"it was undone: the weights and Adam's state are those after step {step - 1}",
                                 step)


def sigterm_as_ctrl_c():
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does, so that ``train`` saves its checkpoint and stops
    the same way when a job manager or ``kill`` ends the process; returns the function that puts SIGTERM's
    default back.  Does nothing (returns a no-op) outside the main thread or when the program has already
    given SIGTERM a handler of its own."""
    import signal
    import threading
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        return lambda: None

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, raise_interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


# =====================================================================================
# Checkpoints: what train() saves, and the checks a file passes before it is resumed
# =====================================================================================
# A checkpoint holds the weights, Adam's moments, the shuffling RNG, the position and the history, under a
# fingerprint of the run (model class and config, settings, loss name, data hash).  The whole file is
# checked (_check_checkpoint, _check_rng, _check_progress) before anything is loaded, so a stale or damaged
# file raises CheckpointMismatchError naming the field and leaves the model untouched.


class CheckpointMismatchError(ValueError):
    """A training checkpoint that does not fit this run: written for another model configuration, dataset or
    training settings, or damaged (unreadable, a field missing, a weight or Adam moment of the wrong shape,
    a step outside the run).  The message names the file and the field."""


CHECKPOINT_FORMAT = "chem-transformer-checkpoint"


def _callable_name(fn):
    """A stable name for a loss function (functools.partial included) for the checkpoint fingerprint."""
    inner = getattr(fn, "func", None)
    if inner is not None:
        return f"{_callable_name(inner)}({sorted((k, repr(v)) for k, v in (fn.keywords or {}).items())})"
    return getattr(fn, "__qualname__", type(fn).__name__)


def _fingerprint(model, settings, loss_fn, train_data, valid_data):
    """What a checkpoint must match to be resumed: model class and config, training settings (all but the
    worker count), the loss function's name, and a sha256 of the training and validation data."""
    import hashlib
    data = json.dumps([train_data, valid_data or []], default=repr, separators=(",", ":")).encode()
    keep = {k: v for k, v in settings.items() if k != "workers"}
    return {"class": type(model).__name__, "config": getattr(model, "config", None), "settings": keep,
            "loss_fn": _callable_name(loss_fn), "data_sha256": hashlib.sha256(data).hexdigest()}


def _save_checkpoint(path, fingerprint, model, opt, rng, progress, history, elapsed):
    """Atomically write everything train() needs to continue bit-identically from this point."""
    obj = {"format": CHECKPOINT_FORMAT, "version": 1, "fingerprint": fingerprint,
           "weights": {p.name: p.data for p in model.params()}, "adam": opt.state_dict(),
           "rng": rng.getstate(), "progress": progress, "history": history, "elapsed": elapsed}
    atomic_write(path, json.dumps(obj, allow_nan=False, separators=(",", ":")))


def _load_checkpoint(path, fingerprint, model, opt, rng, limits=None):
    """Restore a checkpoint into model, opt and rng; returns (progress, history, elapsed).  The whole file is
    checked before anything is restored (``_check_checkpoint``): a checkpoint of another model, dataset or
    setting, a missing field, a weight or Adam moment of the wrong shape, or a position outside the run
    raises CheckpointMismatchError naming the file and the field, and leaves model, opt and rng untouched."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:                       # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointMismatchError(f"checkpoint {path} is unreadable ({e}); delete it to start afresh") from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT or obj.get("version") != 1:
        raise CheckpointMismatchError(f"{path} is not a version-1 {CHECKPOINT_FORMAT} file")
    _check_checkpoint(path, obj, fingerprint, model, limits or {})
    for p in model.params():
        p.data = obj["weights"][p.name]
        p.grad = zeros_like(p.data)
    opt.t, opt.m, opt.v = obj["adam"]["t"], obj["adam"]["m"], obj["adam"]["v"]
    version, state, gauss = obj["rng"]
    rng.setstate((version, tuple(state), gauss))
    return obj["progress"], obj["history"], obj["elapsed"]


_CHECKPOINT_FIELDS = ("fingerprint", "weights", "adam", "rng", "progress", "history", "elapsed")


def _bad_checkpoint(path, field, what):
    return CheckpointMismatchError(f"checkpoint {path}: field {field!r} {what}; delete it to start afresh")


def _like(value, template):
    """True when ``value`` has the structure of ``template`` (a vector or a list of rows) with finite numbers."""
    rows_t = template if template and isinstance(template[0], list) else None
    if rows_t is None:
        return isinstance(value, list) and len(value) == len(template) and _finite_numbers(value)
    return (isinstance(value, list) and len(value) == len(rows_t)
            and all(isinstance(r, list) and len(r) == len(t) and _finite_numbers(r) for r, t in zip(value, rows_t)))


def _finite_numbers(row):
    return all(type(x) in (float, int) and math.isfinite(x) for x in row)


def _check_checkpoint(path, obj, fingerprint, model, limits):
    """Raise CheckpointMismatchError unless every field of checkpoint ``obj`` fits this run: the fingerprint,
    the weights (names and shapes of ``model``'s), Adam's step and moments, the RNG state, the position
    (step within ``limits['total_steps']``, epoch, data order, Adam's step = the step) and the history."""
    for field in _CHECKPOINT_FIELDS:
        if field not in obj:
            raise _bad_checkpoint(path, field, "is missing")
    old = obj["fingerprint"] if isinstance(obj["fingerprint"], dict) else {}
    diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
    if diff:
        detail = "; ".join(f"{k}: checkpoint {old.get(k)!r} vs now {fingerprint.get(k)!r}" for k in diff)
        raise CheckpointMismatchError(f"checkpoint {path} was written for a different run ({detail[:600]}); "
                                      "delete it to start afresh, or pass another checkpoint path")
    params, weights, adam = model.params(), obj["weights"], obj["adam"]
    names = [p.name for p in params]
    if not isinstance(weights, dict):
        raise _bad_checkpoint(path, "weights", f"is a {type(weights).__name__}, not a dict of named weights")
    if sorted(weights) != sorted(names):
        raise _bad_checkpoint(path, "weights", f"does not hold this model's parameters (missing "
                              f"{sorted(set(names) - set(weights))[:5]}, "
                              f"unexpected {sorted(set(weights) - set(names))[:5]})")
    for p in params:
        if not _like(weights[p.name], p.data):
            raise _bad_checkpoint(path, f"weights.{p.name}", f"is not a {p.shape} array of finite numbers")
    _check_adam(path, adam, params)
    _check_rng(path, obj["rng"])
    _check_progress(path, obj, limits)
    _check_history(path, obj["history"], obj["progress"])


def _check_adam(path, adam, params):
    """Adam's state: the keys t, m and v; m and v one finite array per parameter, of its shape; v >= 0 (a
    mean of squares: the update divides by its square root)."""
    if not isinstance(adam, dict) or not all(k in adam for k in ("t", "m", "v")):
        raise _bad_checkpoint(path, "adam", "needs the keys t, m and v")
    for key in ("m", "v"):
        moments = adam[key]
        if not isinstance(moments, list) or len(moments) != len(params):
            raise _bad_checkpoint(path, f"adam.{key}", f"must hold one array per parameter ({len(params)})")
        for p, m in zip(params, moments):
            if not _like(m, p.data):
                raise _bad_checkpoint(path, f"adam.{key}", f"entry for {p.name!r} is not a {p.shape} array "
                                      "of finite numbers")
            if key == "v":
                low = min(min(r) for r in _array_rows([m]))
                if low < 0:
                    raise _bad_checkpoint(path, "adam.v", f"entry for {p.name!r} holds {low!r}; a second "
                                          "moment (a mean of squared gradients) is never negative")


def _check_rng(path, state):
    try:
        version, inner, gauss = state
        random.Random().setstate((version, tuple(inner), gauss))
    except (TypeError, ValueError) as e:
        raise _bad_checkpoint(path, "rng", f"is not a random.Random state ({e})") from None


def _check_progress(path, obj, limits):
    """The position (``progress``: step, epoch, data order, next batch, the epoch's running loss and batch
    count), Adam's step and the elapsed time must describe this run."""
    prog, elapsed = obj["progress"], obj["elapsed"]
    keys = ("step", "epoch", "order", "pos", "ep_loss", "ep_batches")
    if not isinstance(prog, dict) or any(k not in prog for k in keys):
        raise _bad_checkpoint(path, "progress", f"needs the keys {', '.join(keys)}")
    total, n = limits.get("total_steps"), limits.get("n")
    epochs, batch = limits.get("epochs"), limits.get("batch_size", 1)
    step = prog["step"]
    if type(step) is not int or step < 0 or (total is not None and step > total):
        raise _bad_checkpoint(path, "progress.step", f"is {step!r}, outside this run's 0..{total} steps")
    epoch = prog["epoch"]
    if type(epoch) is not int or epoch < 1 or (epochs is not None and epoch > epochs + 1):
        raise _bad_checkpoint(path, "progress.epoch", f"is {epoch!r}, outside this run's 1..{epochs} epochs")
    order = prog["order"]
    if order is not None and (not isinstance(order, list) or any(type(i) is not int for i in order)
                              or (n is not None and sorted(order) != list(range(n)))):
        raise _bad_checkpoint(path, "progress.order", f"is not an order of the {n} training samples")
    pos = prog["pos"]
    if type(pos) is not int or pos < 0 or (n is not None and pos > n + batch):
        raise _bad_checkpoint(path, "progress.pos", f"is {pos!r}, outside the {n} training samples")
    per_epoch = math.ceil(n / batch) if n is not None else None
    nb = prog["ep_batches"]
    if type(nb) is not int or nb < 0 or (per_epoch is not None and nb > per_epoch):
        raise _bad_checkpoint(path, "progress.ep_batches", f"is {nb!r}, outside this run's 0..{per_epoch} "
                              "batches per epoch")
    if not _finite_numbers([prog["ep_loss"]]):
        raise _bad_checkpoint(path, "progress.ep_loss", f"is {prog['ep_loss']!r}, not a finite number")
    adam_t = obj["adam"]["t"]
    if type(adam_t) is not int or adam_t != step:
        raise _bad_checkpoint(path, "adam.t", f"is {adam_t!r} but progress.step is {step}")
    if type(elapsed) not in (int, float) or not math.isfinite(elapsed) or elapsed < 0:
        raise _bad_checkpoint(path, "elapsed", f"is {elapsed!r}, not a time in seconds")


_STEP_RECORD = {"step": int, "epoch": int, "loss": float, "lr": float, "grad_norm": float}
_EPOCH_RECORD = {"epoch": int, "train_loss": float, "steps": int, "elapsed": float}


def _check_history(path, hist, prog):
    """The history: one step record per step done (step 1, 2, ... with finite loss, lr and grad_norm), one
    epoch record per epoch done (epoch 1, 2, ... with finite numbers throughout, epoch_fn's metrics included:
    a checkpoint is JSON without NaN), and resumed_at_steps, if present, a list of steps."""
    if (not isinstance(hist, dict) or not isinstance(hist.get("steps"), list)
            or not isinstance(hist.get("epochs"), list)):
        raise _bad_checkpoint(path, "history", "needs the lists steps and epochs")
    step, epoch = prog["step"], prog["epoch"]
    if len(hist["steps"]) != step:
        raise _bad_checkpoint(path, "history.steps", f"has {len(hist['steps'])} records for {step} steps")
    if len(hist["epochs"]) != epoch - 1:
        raise _bad_checkpoint(path, "history.epochs", f"has {len(hist['epochs'])} records, but "
                              f"{epoch - 1} epochs are done")
    for field, records, spec, key in (("steps", hist["steps"], _STEP_RECORD, "step"),
                                      ("epochs", hist["epochs"], _EPOCH_RECORD, "epoch")):
        for i, rec in enumerate(records):
            if not (isinstance(rec, dict) and rec.get(key) == i + 1 and _json_finite(rec)
                    and all(_of_type(rec.get(k), t) for k, t in spec.items())):
                raise _bad_checkpoint(path, f"history.{field}[{i}]", f"is {str(rec)[:200]}, not the record of "
                                      f"{key} {i + 1} ({', '.join(spec)}: finite numbers)")
    resumed = hist.get("resumed_at_steps", [])
    if not isinstance(resumed, list) or any(type(s) is not int or not 0 <= s <= step for s in resumed):
        raise _bad_checkpoint(path, "history.resumed_at_steps", f"is {resumed!r}, not a list of steps")


def _of_type(value, kind):
    """An int (not a bool) for int, a finite int or float for float."""
    return type(value) is int if kind is int else (type(value) in (int, float) and math.isfinite(value))


def _json_finite(value):
    """True when every number in a JSON value (dicts, lists, numbers, strings, None) is finite."""
    if isinstance(value, dict):
        return all(_json_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_json_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


# =====================================================================================
# Data parallelism: the processes behind train()'s batches, and parallel_map
# =====================================================================================
# ``train`` asks a runner for the summed loss (and gradient) of a batch: _Serial in this process, or
# _DataParallel, which forks workers once per call of ``train`` and splits every batch between them.
# parallel_map forks workers for independent items (evaluation, decoding).  Plumbing, not the recipe.


def default_workers():
    """The number of CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _usable_workers(workers, cap, tag=None):
    """How many processes to use: ``workers`` (default: the number of cores), at most ``cap`` (the items
    to share out) and at least 1; 1 where the platform cannot fork (said on stdout when ``tag`` is given)."""
    workers = default_workers() if workers is None else int(workers)
    workers = max(1, min(workers, cap))
    if workers > 1:
        import multiprocessing as mp
        if "fork" not in mp.get_all_start_methods():
            if tag:
                print(f"[{tag}] fork is not available on this platform: training in one process", flush=True)
            workers = 1
    return workers


def _runner(model, datasets, loss_fn, workers, reduction):
    """``train``'s batch runner: _DataParallel with ``workers`` > 1 processes, else _Serial."""
    if workers > 1:
        return _DataParallel(model, datasets, loss_fn, workers, reduction)
    return _Serial(model, datasets, loss_fn, reduction)


def _mean_of(total_count):
    """total / count of a runner's (summed loss, samples or tokens) pair (0 when nothing was counted)."""
    total, count = total_count
    return total / (count or 1)


class _Serial:
    """``train``'s batch runner in this process: ``run("grad", which, indices, drop_key)`` returns the
    summed loss of those samples of dataset ``which`` and what it counts (samples, or tokens with
    reduction "token"), adding their gradients into Param.grad; ``run("eval", ...)`` only sums the losses
    (forward passes).  _DataParallel has the same interface."""

    n = 1

    def __init__(self, model, datasets, loss_fn, reduction="sample"):
        self.model, self.datasets, self.loss_fn, self.reduction = model, datasets, loss_fn, reduction

    def run(self, kind, which, indices, drop_key=None):
        return _loss_sum(self.model, self.loss_fn, self.datasets[which], indices, backward=(kind == "grad"),
                         reduction=self.reduction, drop_key=drop_key)

    def close(self, wait=True):
        pass


class _DataParallel:
    """Persistent forked workers: the parent computes share 0 of every batch, workers 1..N-1 the rest
    (shares of about equal token count, ``_balanced_shares``, so that no process waits on a longer share).

    Every call ships the current flat parameter vector; gradients come back as flat vectors and are
    added into the parent's Param.grad in worker order, so a fixed worker count is deterministic.
    """

    def __init__(self, model, datasets, loss_fn, n_workers, reduction="sample"):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        self.model, self.datasets, self.loss_fn, self.reduction = model, datasets, loss_fn, reduction
        self.params = model.params()
        self.conns, self.procs = [], []
        for _ in range(n_workers - 1):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, daemon=True,
                            args=(child, model, datasets, loss_fn, self.conns + [parent], os.getpid(), reduction))
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self.n = n_workers

    def run(self, kind, which, indices, drop_key=None):
        """(Sum of losses, count) over ``indices`` of dataset ``which``; with kind == "grad" also the summed
        gradient (added into the parent's Param.grad, which the caller zeroes first)."""
        shares = _balanced_shares(indices, self.datasets[which], self.n)   # equal token counts per process
        flat = _flat(self.params, "data").tobytes()
        for conn, share in zip(self.conns, shares[1:]):                    # the workers run in our mode
            conn.send((kind, flat, which, share, drop_key, self.model.training))
        total, count = _loss_sum(self.model, self.loss_fn, self.datasets[which], shares[0],
                                 backward=(kind == "grad"), reduction=self.reduction, drop_key=drop_key)
        for k, conn in enumerate(self.conns):
            try:
                status, value, grads = conn.recv()
            except (EOFError, OSError):
                raise RuntimeError(f"data-parallel worker {k + 1} stopped (exit code {self.procs[k].exitcode}; "
                                   "killed?)") from None
            if status != "ok":
                raise RuntimeError(f"data-parallel worker failed:\n{value}")
            total, count = total + value[0], count + value[1]
            if kind == "grad":
                _set_flat(self.params, array("d", grads), "grad", accumulate=True)
        return total, count

    def close(self, wait=True):
        """Stop the workers: ask them to stop and wait up to 5 s each; ``wait=False`` (Ctrl-C: a worker may
        be busy with its share) kills them at once (they ignore SIGINT and SIGTERM, which are the parent's
        to handle).  A second call does nothing."""
        for conn in self.conns:
            try:
                if wait:
                    conn.send(("stop",))
                conn.close()
            except OSError:
                pass
        for p in self.procs:
            if not wait:
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.conns, self.procs = [], []


def _flat(params, which):
    """All entries of every param's data (or grad) in one array('d')."""
    out = array("d")
    for p in params:
        for r in p.rows(which):
            out.extend(r)
    return out


def _set_flat(params, flat, which, accumulate=False):
    """Write (or add, with accumulate) a flat vector back into params' data (or grad), in place."""
    o = 0
    for p in params:
        for r in p.rows(which):
            n = len(r)
            if accumulate:
                r[:] = map(add, r, flat[o:o + n])
            else:
                r[:] = flat[o:o + n]
            o += n
    if o != len(flat):
        raise ValueError(f"flat vector has {len(flat)} entries, the parameters {o}")


def _loss_sum(model, loss_fn, data, indices, backward, reduction="sample", drop_key=None):
    """(summed loss, count) of samples ``indices``: count is the number of samples, or with reduction
    "token" the counted tokens that loss_fn(..., reduction="sum") reports.  With ``drop_key`` (a step of
    ``train`` in training mode, with a model that drops) sample i's masks are drawn from
    random.Random(f"{drop_key}:{i}"), a function of (seed, step, i) alone, whichever process runs it."""
    total, count = 0.0, 0
    for i in indices:
        if drop_key is not None:
            model.train(random.Random(f"{drop_key}:{i}"))          # training mode, with sample i's own stream
        if reduction == "token":
            loss, n = loss_fn(model, data[i], backward=backward, reduction="sum")
        else:
            loss, n = loss_fn(model, data[i], backward=backward), 1
        total, count = total + loss, count + n
    return total, count


def _die_with_parent(inherited, parent_pid):
    """First thing in a forked worker: make sure it cannot outlive the process that forked it.

    The worker closes its copies of the parent's pipe ends (``inherited``: every parent end that existed at
    the fork), so that once the parent is gone nothing holds them open and the worker's next receive sees
    end-of-file (its send, a broken pipe).  On Linux it also asks the kernel for SIGKILL the moment the
    parent dies (prctl PR_SET_PDEATHSIG), which stops a worker busy in the middle of a computation.  A parent
    that died before that request took effect is caught by comparing os.getppid() with ``parent_pid``."""
    for conn in inherited:
        conn.close()
    if _USE_PDEATHSIG:
        try:
            import ctypes
            import signal
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


_USE_PDEATHSIG = sys.platform.startswith("linux")     # prctl exists on Linux only; elsewhere: pipes and getppid


def _worker_main(conn, model, datasets, loss_fn, inherited, parent_pid, reduction="sample"):
    """A data-parallel worker: receives (kind, params, dataset, indices, drop_key, the parent's mode) and
    returns loss sums and gradients.  It ends on "stop", or when its pipe reaches end-of-file or breaks (the
    parent is gone)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C and SIGTERM are the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(inherited, parent_pid)
    params = model.params()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        kind, flat, which, idx, drop_key, training = msg
        try:
            model.train() if training else model.eval()       # the parent's mode
            _set_flat(params, array("d", flat), "data")
            model.zero_grad()
            total = _loss_sum(model, loss_fn, datasets[which], idx, backward=(kind == "grad"),
                              reduction=reduction, drop_key=drop_key)
            grads = _flat(params, "grad").tobytes() if kind == "grad" else b""
            reply = ("ok", total, grads)
        except Exception:
            reply = ("error", traceback.format_exc(), b"")
        try:
            conn.send(reply)
        except OSError:
            break
    conn.close()


def _item_cost(item):
    """A training item's cost for balancing the workers' shares: its token count (the total length of its
    list parts: (ids, y) -> len(ids), (src, tgt) -> len(src) + len(tgt), a bare id list -> its length)."""
    if isinstance(item, list):
        return len(item)
    if isinstance(item, tuple):
        return sum(len(part) for part in item if isinstance(part, (list, tuple))) or 1
    return 1


def _balanced_shares(indices, data, n):
    """Split ``indices`` into n shares of about equal total cost: longest item first, each to the share
    with the least cost so far (ties to the lower share).  Deterministic; each share keeps batch order."""
    cost = {i: _item_cost(data[i]) for i in indices}
    load, shares = [0] * n, [[] for _ in range(n)]
    for i in sorted(indices, key=lambda i: -cost[i]):                  # stable: ties keep batch order
        k = load.index(min(load))
        shares[k].append(i)
        load[k] += cost[i]
    position = {i: p for p, i in enumerate(indices)}
    return [sorted(share, key=position.__getitem__) for share in shares]


def parallel_map(fn, items, *, workers=None, seed=0, progress=None):
    """[fn(item, rng) for item in items] on forked worker processes, results in input order.

    ``rng`` is a random.Random seeded from (``seed``, the item's index), so the output does not depend on
    the worker count or on which worker took which item.  The workers are forked when this is called, so
    ``fn`` may be any function that exists at that moment (a closure inside a demo script, a model
    loaded a line earlier): nothing but the results is pickled.  Items are handed out one at a time
    (long and short items balance themselves).  ``workers`` defaults to the number of cores; 1, or a
    platform without fork, runs serially in this process.  ``progress="tag"`` prints a line with the
    count, elapsed time and ETA about every 10 %.  An exception in ``fn`` stops the map and is re-raised
    here as RuntimeError carrying the worker's traceback.
    """
    items = list(items)
    n = len(items)
    workers = _usable_workers(workers, n)
    t0, every = time.perf_counter(), max(1, n // 10)

    def report(done):
        if progress and (done % every == 0 or done == n):
            el = time.perf_counter() - t0
            print(f"[{progress}] {done}/{n} elapsed {format_time(el)} ETA {format_time(el / done * (n - done))}",
                  flush=True)

    if workers > 1:
        return _map_forked(fn, items, seed, workers, report)
    out = []
    for i, item in enumerate(items):
        out.append(fn(item, _item_rng(seed, i)))
        report(i + 1)
    return out


def _map_forked(fn, items, seed, workers, report):
    """parallel_map's forked path: ``workers`` processes claim indices from a shared counter and send back
    (i, ok, value), each on its own pipe; the parent puts each result in place, calling ``report(done)``
    after each.  A worker dies with the parent (``_die_with_parent``)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context("fork")
    n = len(items)
    counter, conns, procs = ctx.Value("l", 0), [], []
    for _ in range(workers):
        parent, child = ctx.Pipe(duplex=False)                       # parent receives, child sends
        procs.append(ctx.Process(target=_map_worker, daemon=True,
                                 args=(fn, items, seed, counter, child, conns + [parent], os.getpid())))
        procs[-1].start()
        child.close()
        conns.append(parent)
    out, done, live = [None] * n, 0, list(conns)
    try:
        while done < n:
            if not live:
                raise RuntimeError(f"parallel_map: every worker exited with {n - done} of {n} items "
                                   "unfinished (killed?)")
            for conn in wait(live):
                try:
                    i, ok, value = conn.recv()
                except (EOFError, OSError):
                    live.remove(conn)                                # this worker has exited
                    continue
                if not ok:
                    raise RuntimeError(f"parallel_map: fn failed on item {i}:\n{value}")
                out[i] = value
                done += 1
                report(done)
    finally:
        for conn in conns:
            conn.close()
        for p in procs:
            if done < n:
                p.terminate()
            p.join(timeout=5)
    return out


def _item_rng(seed, index):
    """The random stream of item ``index`` in parallel_map: a function of (seed, index) only."""
    return random.Random(f"parallel_map:{seed}:{index}")


def keyed_rng(*key):
    """A random stream named by ``key`` (values with a stable repr: str, int, float, bool, None, tuples of them).

    random.Random seeded from the text of the key (a str seed goes through SHA-512, not Python's salted hash),
    so one key gives one stream in every process, whatever was drawn before.  A caller of parallel_map whose
    items belong to named settings keys each item's stream by (setting, index within the setting) instead of
    using the rng parallel_map passes (keyed by the flat index): a setting's i-th draw then does not depend on
    how many items other settings hold, and n draws of a setting are the first n of any larger count."""
    return random.Random("keyed_rng:" + repr(tuple(key)))


def _map_worker(fn, items, seed, counter, conn, inherited, parent_pid):
    """A parallel_map worker: takes the next unclaimed index until none is left, sends (i, ok, value).  It
    stops when the parent is gone (os.getppid() changed, or the pipe broke)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)       # not a handler the parent installed
    _die_with_parent(inherited, parent_pid)
    n = len(items)
    while os.getppid() == parent_pid:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= n:
            break
        try:
            reply = (i, True, fn(items[i], _item_rng(seed, i)))
        except BaseException:
            reply = (i, False, traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:                                 # broken pipe: the parent is gone
            break
        except Exception:                               # the result cannot be pickled
            conn.send((i, False, traceback.format_exc()))
            break
        if not reply[1]:
            break
    conn.close()


# =====================================================================================
# Model files
# =====================================================================================
# save_model writes a model as one JSON file (atomically); load_model checks everything in it before it
# builds anything; set_weights gives a model named weights.

MODEL_FORMAT = "chem-transformer-model"
MODEL_FORMAT_VERSION = 1


def save_model(model, path, meta=None):
    """Save a model as JSON: format name and version, class name, config, named weights, optional meta.
    Written atomically; non-finite weights raise ValueError instead of writing a broken file."""
    obj = {"format": MODEL_FORMAT, "version": MODEL_FORMAT_VERSION, "class": type(model).__name__,
           "config": model.config, "weights": {p.name: p.data for p in model.params()}, "meta": meta or {}}
    try:
        text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    except ValueError as e:
        raise ValueError(f"save_model: refusing to write {path}: a weight is NaN or infinite ({e})") from None
    atomic_write(path, text)


class ModelFormatError(ValueError):
    """A model file that ``load_model`` cannot read; the message names the file and what is wrong."""


MAX_MODEL_FILE_MB = 256          # load_model reads no larger file (a 10-million-parameter model is ~200 MB)
MAX_MODEL_PARAMS = 10_000_000    # nor builds a model with more parameters (pure Python: ~1 GB of lists)
_CONFIG_COUNTS = ("vocab_size", "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_layers", "d_ff",
                  "n_out", "max_len")


def check_model_config(path, cls, config, max_params=MAX_MODEL_PARAMS):
    """ModelFormatError naming the field unless ``config`` can build ``cls`` within ``max_params`` parameters:
    every size a positive int, pad ids and seed ints (or None), token_features rows of finite numbers; the
    parameter count (param_count_formula) is computed before anything is allocated.  ``load_model`` checks
    every file's config with it, torch_bridge an imported torch file's."""
    import inspect
    if not isinstance(config, dict):
        raise ModelFormatError(f"load_model: bad config in {path}: {type(config).__name__}, not a dict")
    known = {k: v.default for k, v in inspect.signature(cls).parameters.items()}
    unknown = sorted(set(config) - set(known))
    missing = sorted(k for k, v in known.items() if v is inspect.Parameter.empty and k not in config)
    if unknown or missing:
        raise ModelFormatError(f"load_model: bad config in {path}: unknown field(s) {unknown}, missing {missing}")
    full = dict(known, **config)
    full["d_ff"] = 2 * full["d_model"] if full["d_ff"] is None else full["d_ff"]
    for key in _CONFIG_COUNTS:
        v = full.get(key, 1)
        if type(v) is not int or v < 1:
            raise ModelFormatError(f"load_model: bad config in {path}: {key} is {v!r}, not a positive int")
    rate = full.get("dropout", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ModelFormatError(f"load_model: bad config in {path}: dropout is {rate!r}, not a rate in [0, 1)")
    for key in ("pad_id", "src_pad_id", "seed"):
        if key in full and full[key] is not None and type(full[key]) is not int:
            raise ModelFormatError(f"load_model: bad config in {path}: {key} is {full[key]!r}, not an int")
    feats = full.get("token_features")
    if feats is not None and not (isinstance(feats, list) and feats and all(
            isinstance(r, list) and r and _finite_numbers(r) for r in feats)):
        raise ModelFormatError(f"load_model: bad config in {path}: token_features is not rows of finite numbers")
    n = _config_param_count(cls.__name__, full)
    if n > max_params:
        raise ModelFormatError(f"load_model: {path} describes a model of {n:,} parameters, over the limit of "
                               f"{max_params:,} (load_model's max_params); nothing was allocated")


def load_model(path, *, max_mb=MAX_MODEL_FILE_MB, max_params=MAX_MODEL_PARAMS):
    """Rebuild a model saved by ``save_model``.  Every problem with the file (not JSON, not UTF-8, wrong
    format/version, unknown class, bad config, missing or extra weight, wrong shape, a non-number) raises
    ModelFormatError (a ValueError) naming the file and the problem; a missing file is FileNotFoundError.
    A file over ``max_mb`` MB is refused before it is read, a config of more than ``max_params``
    parameters before anything is allocated."""
    size = os.path.getsize(path)
    if size > max_mb * 2 ** 20:
        raise ModelFormatError(f"load_model: {path} is {size / 2 ** 20:,.0f} MB, over the limit of {max_mb} MB "
                               "for a model file (load_model's max_mb); nothing was read")
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except ValueError as e:                      # JSONDecodeError, UnicodeDecodeError
        raise ModelFormatError(f"load_model: {path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != MODEL_FORMAT:
        raise ModelFormatError(f"load_model: {path} is not a {MODEL_FORMAT} file")
    if obj.get("version") != MODEL_FORMAT_VERSION:
        raise ModelFormatError(f"load_model: {path} has format version {obj.get('version')!r}, "
                               f"this library reads version {MODEL_FORMAT_VERSION}")
    cls = MODEL_CLASSES.get(obj.get("class")) if isinstance(obj.get("class"), str) else None
    if cls is None:
        raise ModelFormatError(f"load_model: unknown model class {obj.get('class')!r} in {path}")
    check_model_config(path, cls, obj.get("config"), max_params)
    try:
        model = cls(**obj["config"])
    except (TypeError, KeyError, ValueError) as e:
        raise ModelFormatError(f"load_model: bad config in {path}: {e}") from None
    return set_weights(model, obj.get("weights", {}), path)


def set_weights(model, weights, where):
    """Give ``model`` the named weights ``weights`` ({parameter name: nested lists}, as ``save_model`` writes
    them) and return it; the gradients are zeroed.  Every parameter must be there, with the model's shape and
    finite numbers, and nothing else: otherwise ModelFormatError, the message naming ``where`` (the file, or
    the file and member, the weights came from) as ``load_model``'s messages name the file.  ``load_model``
    uses it; so does the predictor for the extra members of an ensemble file."""
    if not isinstance(weights, dict):
        raise ModelFormatError(f"load_model: 'weights' in {where} is not a dict of named weights")
    named = model.named_params()
    missing = [k for k in named if k not in weights]
    if missing:
        raise ModelFormatError(f"load_model: {where} is missing weight(s) {missing[:5]}")
    extra = [k for k in weights if k not in named]
    if extra:
        raise ModelFormatError(f"load_model: {where} has unexpected weight(s) {extra[:5]}")
    for name, p in named.items():
        w = weights[name]
        if not _like(w, p.data):
            shape = shape_of(w) if isinstance(w, list) else type(w).__name__
            raise ModelFormatError(f"load_model: weight {name!r} in {where} has shape {shape} or a non-number, "
                                   f"the model expects {p.shape} finite numbers")
        p.data = [[float(x) for x in r] for r in w] if isinstance(p.data[0], list) else [float(x) for x in w]
        p.grad = zeros_like(p.data)
    return model
