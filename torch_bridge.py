"""Graduate to PyTorch: our three models as ``torch.nn.Module``s, the same training recipe, checkpoints
and multi-process data parallelism (DistributedDataParallel).

transformer.py computes one sequence at a time with hand-written backward passes.  This module writes
the SAME forward passes with torch tensors, batched along a leading dimension B, and lets autograd do
the backward.  Nothing is reinterpreted: pre-LN blocks (5.4), LayerNorm eps 1e-5 with the biased
variance (5.7), GELU's tanh approximation (5.2), 1/sqrt(d_h) scaling (2.13), RoPE pairs (2i, 2i+1)
rotated as ``rope_rows`` does (4.7), the sine table of eq. (4.4), Linear weights laid out as ours
(Y = X W + b with W (d_in, d_out)), the tied head logits = H E^T (8.5), and a query whose keys are all
masked gets a zero output.  In float64 the logits agree with ours to ~1e-15.

    to_torch(model, dtype)     our model -> torch module; its state_dict keys are our Param names
    from_torch(module)         torch module -> our model (bit-identical weights in float64)
    lm_losses, seq2seq_losses, regression_losses
                               per-sample losses (B,) of a batch, the semantics of lm_loss,
                               seq2seq_loss and regression_loss (ignore_index, label smoothing)
    train_torch(module, data, loss, ...)
                               transformer.train's recipe with torch.optim.Adam; checkpoints;
                               DistributedDataParallel when started by torchrun

Shapes: B batch, T target length, S source length, d width, H heads, d_h = d / H, V vocabulary.
Batches are RIGHT-padded: sequence b occupies positions 0 .. len_b - 1 (so positions, sine rows and
RoPE angles are those of the unpadded sequence).  Causal self-attention never looks right, so padded
LM and decoder inputs need no mask; padded encoder/source keys are masked with a padding mask
(True = pad), combined with ``pad_id`` / ``src_pad_id`` exactly as our ``padding_mask`` does.

CLI:
    python torch_bridge.py export models/smiles_lm.json smiles_lm.pt      # JSON model -> torch file
    python torch_bridge.py import smiles_lm.pt models/smiles_lm_copy.json  # and back (meta kept)

transformer.py never imports this module.
"""
from __future__ import annotations

if __name__ == "__main__":     # python torch_bridge.py ...: a Ctrl-C while torch imports (a second or more) is
    import safe_io              # one line and exit status 130, not a traceback
    safe_io.exit_130_on_ctrl_c("torch_bridge.py: interrupted (Ctrl-C)")

import argparse
import functools
import hashlib
import inspect
import io
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformer as core
import safe_io

__all__ = ["to_torch", "from_torch", "build_torch", "TorchLM", "TorchEncoder", "TorchEncoderDecoder",
           "cross_entropy_per_row", "lm_losses", "sample_lm", "seq2seq_losses", "regression_losses", "batch_loss",
           "train_torch", "save_torch", "load_torch", "TorchFormatError", "main"]

# =====================================================================================
# 1. Position tables (computed in Python exactly as transformer.py does, then cached as tensors)
# =====================================================================================

_TABLES = {}


def _table(kind, T, d, like):
    """The first T rows of a position table for width d, as a tensor of like's dtype and device.

    kind "sine": the (T, d) table of eq. (4.4) (``core.sine_cosine_table``);
    kind "cos" / "sin": cos(t w_i), sin(t w_i) with w_i = 10000^(-i/d), i = 0, 2, ..: (T, d/2), as
    ``rope_rows`` uses them.  Grown on demand (at least 64 rows), like our caches."""
    key = (kind, d, like.dtype, like.device)
    tab = _TABLES.get(key)
    if tab is None or tab.shape[0] < T:
        n = max(T, 64, 2 * tab.shape[0] if tab is not None else 0)
        if kind == "sine":
            rows = core.sine_cosine_table(n, d)
        else:
            ws = [core.ROPE_BASE ** (-i / d) for i in range(0, d, 2)]
            f = math.cos if kind == "cos" else math.sin
            rows = [[f(t * w) for w in ws] for t in range(n)]
        tab = _TABLES[key] = torch.tensor(rows, dtype=like.dtype, device=like.device)
    return tab[:T]


def rope(X):
    """RoPE, eq. (4.7), on X (B, H, T, d_h), row t at position t: the pair (x_2i, x_2i+1) becomes
    (x c - y s, x s + y c) with c, s = cos, sin(t 10000^(-2i/d_h)); as ``rope_rows``."""
    T, d_h = X.shape[-2], X.shape[-1]
    c, s = _table("cos", T, d_h, X), _table("sin", T, d_h, X)         # (T, d_h/2)
    x, y = X[..., 0::2], X[..., 1::2]                                   # even / odd members of each pair
    return torch.stack((x * c - y * s, x * s + y * c), dim=-1).flatten(-2)   # re-interleave (.., T, d_h)


# =====================================================================================
# 2. Layers: the attribute names are our Param names' parts, so state_dict() keys are our names
# =====================================================================================


class Linear(nn.Module):
    """Y = X W + b with W (d_in, d_out), our layout (torch's nn.Linear stores W^T), eq. (2.15)."""

    def __init__(self, d_in, d_out, bias=True, dtype=torch.float64):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(d_in, d_out, dtype=dtype))
        self.b = nn.Parameter(torch.zeros(d_out, dtype=dtype)) if bias else None

    def forward(self, X):                                               # X (.., d_in)
        Y = X @ self.W                                                  # (.., d_out)
        return Y if self.b is None else Y + self.b


class Embedding(nn.Module):
    """Lookup table W (n, d): X[b, t] = W[ids[b, t]]."""

    def __init__(self, n, d, dtype=torch.float64):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(n, d, dtype=dtype))

    def forward(self, ids):                                             # ids (B, T) long
        n = self.W.shape[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ValueError(f"Embedding: an index is out of range [0, {n})")
        return F.embedding(ids, self.W)                                 # (B, T, d)


class LayerNorm(nn.Module):
    """y = gamma (x - mu) / sqrt(var + eps) + beta per row, biased variance, eps 1e-5, eq. (5.7)."""

    def __init__(self, d, eps=1e-5, dtype=torch.float64):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(d, dtype=dtype))

    def forward(self, X):
        return F.layer_norm(X, X.shape[-1:], self.gamma, self.beta, eps=self.eps)


def _drop(X, p, training):
    """Inverted dropout (section 5.6) in train mode only, as ours: keep with 1 - p, scale by 1/(1 - p)."""
    return F.dropout(X, p, training=True) if p and training else X


class FeedForward(nn.Module):
    """FFN(x) = GELU(x W1 + b1) W2 + b2, eq. (5.1), GELU with the tanh approximation, eq. (5.2); in train
    mode the hidden layer is dropped with rate ``dropout``."""

    def __init__(self, d, d_ff, dtype=torch.float64, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.fc1 = Linear(d, d_ff, dtype=dtype)
        self.fc2 = Linear(d_ff, d, dtype=dtype)

    def forward(self, X):
        return self.fc2(_drop(F.gelu(self.fc1(X), approximate="tanh"), self.p, self.training))


def softmax_rows(Sc):
    """Softmax over the last axis, eq. (2.3); a row whose entries are all -inf gives zeros, not NaN."""
    live = Sc.amax(dim=-1, keepdim=True) > -math.inf                    # (.., 1) some key visible
    return torch.softmax(torch.where(live, Sc, torch.zeros_like(Sc)), dim=-1) * live


class MultiHeadAttention(nn.Module):
    """Multi-head attention, eqs. (2.11)-(2.16), as ours: self-attention projects [Q K V] = X W_qkv;
    cross-attention Q = X W_q and [K V] = M W_kv.  Per head S = Q_h K_h^T / sqrt(d_h) + mask,
    A = softmax(S), O_h = A V_h; heads concatenated and projected by W_o.  RoPE rotates Q_h, K_h.
    In train mode A is dropped with rate ``dropout`` after the softmax (a hidden key stays at 0)."""

    def __init__(self, d, n_heads, causal=False, rope=False, cross=False, dtype=torch.float64, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.d, self.H, self.d_h = d, n_heads, d // n_heads
        self.causal, self.rope, self.cross = causal, rope, cross
        self.scale = 1.0 / math.sqrt(self.d_h)
        if cross:
            self.q = Linear(d, d, dtype=dtype)
            self.kv = Linear(d, 2 * d, dtype=dtype)
        else:
            self.qkv = Linear(d, 3 * d, dtype=dtype)
        self.o = Linear(d, d, dtype=dtype)

    def _heads(self, Z):                                                # (B, n, d) -> (B, H, n, d_h)
        B, n, _ = Z.shape
        return Z.view(B, n, self.H, self.d_h).transpose(1, 2)

    def _mask(self, T, S, key_padding_mask, like):
        """The additive mask, broadcastable to (B, H, T, S): 0 where a query may look, -inf where not
        (causal, eq. 6.1: keys j > t; padding: keys marked True); None when nothing is hidden."""
        mask = None
        if self.causal:
            mask = torch.full((T, S), -math.inf, dtype=like.dtype, device=like.device).triu(1)   # (T, S)
        if key_padding_mask is not None:
            pad = torch.zeros(key_padding_mask.shape, dtype=like.dtype, device=like.device)
            pad = pad.masked_fill(key_padding_mask, -math.inf)[:, None, None, :]           # (B, 1, 1, S)
            mask = pad if mask is None else mask + pad
        return mask

    def forward(self, X, memory=None, key_padding_mask=None):          # X (B, T, d); memory (B, S, d)
        d = self.d
        if self.cross:
            Q = self.q(X)                                               # (B, T, d)
            K, Vm = self.kv(memory).split(d, dim=-1)                    # (B, S, d) each
        else:
            Q, K, Vm = self.qkv(X).split(d, dim=-1)                     # (B, T, d) each
        Q, K, Vm = self._heads(Q), self._heads(K), self._heads(Vm)      # (B, H, T|S, d_h)
        if self.rope:
            Q, K = rope(Q), rope(K)                                     # rotate Q and K, never V
        B, _, T, _ = Q.shape
        S = K.shape[2]
        Sc = (Q @ K.transpose(-1, -2)) * self.scale                     # (B, H, T, S)
        mask = self._mask(T, S, key_padding_mask, Sc)
        if mask is not None:
            Sc = Sc + mask
            A = softmax_rows(Sc)
        else:
            A = torch.softmax(Sc, dim=-1)                               # (B, H, T, S)
        A = _drop(A, self.p, self.training)
        O = (A @ Vm).transpose(1, 2).reshape(B, T, d)                   # heads concatenated (B, T, d)
        return self.o(O)


class EncoderBlock(nn.Module):
    """Pre-LN encoder block, eq. (5.4): X1 = X + MHA(LN1(X)); Y = X1 + FFN(LN2(X1)); in train mode each
    branch's output is dropped before its residual add."""

    def __init__(self, d, n_heads, d_ff, rope=False, causal=False, dtype=torch.float64, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.ln1 = LayerNorm(d, dtype=dtype)
        self.attn = MultiHeadAttention(d, n_heads, causal=causal, rope=rope, dtype=dtype, dropout=dropout)
        self.ln2 = LayerNorm(d, dtype=dtype)
        self.ffn = FeedForward(d, d_ff, dtype=dtype, dropout=dropout)

    def forward(self, X, key_padding_mask=None):
        X1 = X + _drop(self.attn(self.ln1(X), key_padding_mask=key_padding_mask), self.p, self.training)
        return X1 + _drop(self.ffn(self.ln2(X1)), self.p, self.training)


class DecoderBlock(nn.Module):
    """Pre-LN decoder block: X1 = X + CausalMHA(LN1(X)); X2 = X1 + CrossMHA(LN2(X1), M); Y = X2 + FFN(LN3(X2)).
    With cross=False (the LM block) the cross-attention sub-layer and ln2 are left out.  In train mode each
    branch's output is dropped before its residual add."""

    def __init__(self, d, n_heads, d_ff, rope=False, cross=True, dtype=torch.float64, dropout=0.0):
        super().__init__()
        self.has_cross, self.p = cross, dropout
        self.ln1 = LayerNorm(d, dtype=dtype)
        self.self_attn = MultiHeadAttention(d, n_heads, causal=True, rope=rope, dtype=dtype, dropout=dropout)
        if cross:
            self.ln2 = LayerNorm(d, dtype=dtype)
            self.cross_attn = MultiHeadAttention(d, n_heads, cross=True, dtype=dtype, dropout=dropout)
        self.ln3 = LayerNorm(d, dtype=dtype)
        self.ffn = FeedForward(d, d_ff, dtype=dtype, dropout=dropout)

    def forward(self, X, memory=None, memory_padding_mask=None):
        p, on = self.p, self.training
        X = X + _drop(self.self_attn(self.ln1(X)), p, on)
        if self.has_cross:
            X = X + _drop(self.cross_attn(self.ln2(X), memory, key_padding_mask=memory_padding_mask), p, on)
        return X + _drop(self.ffn(self.ln3(X)), p, on)


class TokenPositionEmbedding(nn.Module):
    """X[b, t] = E[ids] (+ F[ids] W_f with fixed token features F) + P[t]; P per scheme (none, sine,
    learned, rope: nothing added here).  F is a non-persistent buffer: it lives in the config.  In train
    mode the sum is dropped with rate ``dropout``."""

    def __init__(self, vocab_size, d, pos="sine", max_len=512, token_features=None, dtype=torch.float64,
                 dropout=0.0):
        super().__init__()
        self.d, self.scheme, self.max_len, self.p = d, pos, max_len, dropout
        self.tok = Embedding(vocab_size, d, dtype=dtype)
        self.pos = Embedding(max_len, d, dtype=dtype) if pos == "learned" else None
        self.feat = None
        if token_features is not None:
            self.register_buffer("features", torch.tensor(token_features, dtype=dtype), persistent=False)
            self.feat = Linear(len(token_features[0]), d, bias=False, dtype=dtype)   # W_f (k, d)

    def forward(self, ids):                                             # ids (B, T) long
        T = ids.shape[1]
        X = self.tok(ids)                                               # (B, T, d)
        if self.feat is not None:
            X = X + self.feat(self.features[ids])                       # + F[ids] W_f
        if self.scheme == "sine":
            X = X + _table("sine", T, self.d, X)
        elif self.scheme == "learned":
            if T > self.max_len:
                raise core.ShapeError(f"sequence of length {T} exceeds the learned position table "
                                    f"(max_len={self.max_len})")
            X = X + self.pos.W[:T]
        return _drop(X, self.p, self.training)


# =====================================================================================
# 3. Models: called like ours (lists of ids) they return what our forward returns; called with
#    right-padded (B, T) id tensors they return the batch
# =====================================================================================


def _as_batch(ids, like):
    """(ids as a (B, T) long tensor, whether a single list came in)."""
    if isinstance(ids, torch.Tensor):
        return ids.to(device=like.device, dtype=torch.long), False
    return torch.tensor([list(ids)], dtype=torch.long, device=like.device), True


def _pad_mask(ids, pad_id, pad_mask):
    """Keys to hide (B, T) bool: the batch's padding mask, plus ids == pad_id (our ``padding_mask``)."""
    mask = pad_mask.to(ids.device) if pad_mask is not None else None
    if pad_id is not None:
        mask = (ids == pad_id) if mask is None else (mask | (ids == pad_id))
    return mask


class _Bridge(nn.Module):
    """What every bridged model has: our class name and config (for from_torch and saving).  The config's
    ``dropout`` (absent: 0) is the rate every layer drops with in train mode (torch's default; ``eval()``
    never drops), so the rate survives to_torch / from_torch."""

    kind = None

    def _store(self, config):
        self.config = json.loads(json.dumps(config))                    # a deep copy, JSON-safe

    def extra_repr(self):
        return f"kind={self.kind}"


class TorchLM(_Bridge):
    """TransformerLM: embeddings, L causal pre-LN blocks, ln_f, logits = H E^T (tied) or the head.
    forward(ids list) -> (T, V); forward((B, T) right-padded ids) -> (B, T, V)."""

    kind = "TransformerLM"

    def __init__(self, config, dtype=torch.float64):
        super().__init__()
        self._store(config)
        c = self.config
        d, rope_, p = c["d_model"], c["pos"] == "rope", c.get("dropout", 0.0)
        self.embed = TokenPositionEmbedding(c["vocab_size"], d, c["pos"], c["max_len"], dtype=dtype, dropout=p)
        self.blocks = nn.ModuleList(DecoderBlock(d, c["n_heads"], c["d_ff"], rope=rope_, cross=False, dtype=dtype,
                                                 dropout=p) for _ in range(c["n_layers"]))
        self.ln_f = LayerNorm(d, dtype=dtype)
        self.head = None if c["tie_weights"] else Linear(d, c["vocab_size"], dtype=dtype)

    def forward(self, ids):
        ids, single = _as_batch(ids, self.ln_f.gamma)
        X = self.embed(ids)                                             # (B, T, d)
        for b in self.blocks:
            X = b(X)
        Hs = self.ln_f(X)
        logits = Hs @ self.embed.tok.W.T if self.head is None else self.head(Hs)   # (B, T, V)
        return logits[0] if single else logits


class TorchEncoder(_Bridge):
    """TransformerEncoder for regression: embeddings, L pre-LN blocks (padded keys masked), ln_f,
    mean over the non-pad positions, linear head.  forward(ids list) -> (n_out,);
    forward((B, T) ids, pad_mask (B, T) True = pad) -> (B, n_out)."""

    kind = "TransformerEncoder"

    def __init__(self, config, dtype=torch.float64):
        super().__init__()
        self._store(config)
        c = self.config
        d, rope_, p = c["d_model"], c["pos"] == "rope", c.get("dropout", 0.0)
        self.embed = TokenPositionEmbedding(c["vocab_size"], d, c["pos"], c["max_len"],
                                            token_features=c.get("token_features"), dtype=dtype, dropout=p)
        self.blocks = nn.ModuleList(EncoderBlock(d, c["n_heads"], c["d_ff"], rope=rope_, dtype=dtype, dropout=p)
                                    for _ in range(c["n_layers"]))
        self.ln_f = LayerNorm(d, dtype=dtype)
        self.head = Linear(d, c["n_out"], dtype=dtype)

    def forward(self, ids, pad_mask=None):
        ids, single = _as_batch(ids, self.ln_f.gamma)
        mask = _pad_mask(ids, self.config["pad_id"], pad_mask)         # (B, T) or None
        X = self.embed(ids)
        for b in self.blocks:
            X = b(X, key_padding_mask=mask)
        Hs = self.ln_f(X)                                               # (B, T, d)
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else ~mask
        count = keep.sum(dim=1, keepdim=True)                           # (B, 1) non-pad positions
        if bool((count == 0).any()):
            raise ValueError("TransformerEncoder: every position is padding; nothing to pool")
        summed = torch.where(keep[..., None], Hs, torch.zeros_like(Hs)).sum(dim=1)   # (B, d)
        pooled = summed * (1.0 / count.to(Hs.dtype))                    # mean over non-pad positions
        y = self.head(pooled)                                           # (B, n_out)
        return y[0] if single else y


class TorchEncoderDecoder(_Bridge):
    """EncoderDecoder: source encoder -> memory; target decoder with causal self-attention and
    cross-attention (padded source keys masked); head.  forward(src list, tgt list) -> (T, V);
    forward((B, S) src, (B, T) tgt, src_pad_mask (B, S) True = pad) -> (B, T, V)."""

    kind = "EncoderDecoder"

    def __init__(self, config, dtype=torch.float64):
        super().__init__()
        self._store(config)
        c = self.config
        d, H, f, L, rope_ = c["d_model"], c["n_heads"], c["d_ff"], c["n_layers"], c["pos"] == "rope"
        p = c.get("dropout", 0.0)
        self.src_embed = TokenPositionEmbedding(c["src_vocab_size"], d, c["pos"], c["max_len"], dtype=dtype,
                                                dropout=p)
        self.enc = nn.ModuleList(EncoderBlock(d, H, f, rope=rope_, dtype=dtype, dropout=p) for _ in range(L))
        self.enc_ln = LayerNorm(d, dtype=dtype)
        self.tgt_embed = TokenPositionEmbedding(c["tgt_vocab_size"], d, c["pos"], c["max_len"], dtype=dtype,
                                                dropout=p)
        self.dec = nn.ModuleList(DecoderBlock(d, H, f, rope=rope_, cross=True, dtype=dtype, dropout=p)
                                 for _ in range(L))
        self.dec_ln = LayerNorm(d, dtype=dtype)
        self.head = Linear(d, c["tgt_vocab_size"], dtype=dtype)

    def encode(self, src, mask):
        """Encoder memory (B, S, d)."""
        X = self.src_embed(src)
        for b in self.enc:
            X = b(X, key_padding_mask=mask)
        return self.enc_ln(X)

    def decode(self, tgt_in, memory, mask):
        """Logits (B, T, V_tgt)."""
        Y = self.tgt_embed(tgt_in)
        for b in self.dec:
            Y = b(Y, memory, memory_padding_mask=mask)
        return self.head(self.dec_ln(Y))

    def forward(self, src, tgt_in, src_pad_mask=None):
        src, single = _as_batch(src, self.head.W)
        tgt_in, _ = _as_batch(tgt_in, self.head.W)
        mask = _pad_mask(src, self.config["src_pad_id"], src_pad_mask)
        logits = self.decode(tgt_in, self.encode(src, mask), mask)
        return logits[0] if single else logits


TORCH_CLASSES = {c.kind: c for c in (TorchLM, TorchEncoder, TorchEncoderDecoder)}
OUR_CLASSES = {c.__name__: c for c in (core.TransformerLM, core.TransformerEncoder, core.EncoderDecoder)}


def build_torch(kind, config, dtype=torch.float64):
    """An (untrained, zero-weight) torch module for our class name ``kind`` and its config."""
    if kind not in TORCH_CLASSES:
        raise TypeError(f"no torch counterpart for {kind!r}; choose one of {sorted(TORCH_CLASSES)}")
    return TORCH_CLASSES[kind](config, dtype=dtype)


def to_torch(model, dtype=torch.float64):
    """Our model -> the torch module computing the same function, weights copied (rounded to dtype)."""
    module = build_torch(type(model).__name__, model.config, dtype=dtype)
    state = {name: torch.tensor(p.data, dtype=dtype) for name, p in model.named_params().items()}
    module.load_state_dict(state, strict=True)
    return module


def from_torch(module):
    """A torch module (or its DistributedDataParallel wrapper) -> our model with its weights."""
    module = getattr(module, "module", module)
    model = OUR_CLASSES[module.kind](**module.config)
    state = module.state_dict()
    for name, p in model.named_params().items():
        p.data = state[name].detach().to("cpu", torch.float64).tolist()
        p.zero_grad()
    return model


# =====================================================================================
# 4. Losses: per-sample losses (B,) of a list of samples, with our per-sample semantics
# =====================================================================================


def cross_entropy_per_row(logits, targets, counted, label_smoothing=0.0):
    """Per-row cross-entropy (..,) of logits (.., V), 0 where ``counted`` is False.  With label
    smoothing eps: (1 - eps) nll + eps (lse - mean z), eq. (6.4) with q = (1 - eps) onehot + eps / V."""
    logp = torch.log_softmax(logits, dim=-1)                            # z - lse
    safe = torch.where(counted, targets, torch.zeros_like(targets))      # ignored rows: any valid class
    nll = -logp.gather(-1, safe[..., None])[..., 0]                     # lse - z_y
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll + label_smoothing * -logp.mean(dim=-1)
    return torch.where(counted, nll, torch.zeros_like(nll))


def _pad(rows, value, device):
    """Right-pad lists of ints to one (B, T) long tensor, and the (B, T) mask of real positions."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [value] * (T - len(r)) for r in rows], dtype=torch.long, device=device)
    real = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows], device=device)
    return ids, real


def _sequence_means(row_loss, counted):
    """Per-sequence mean over its counted rows (B,); a sequence with none counted gives 0 (ours)."""
    n = counted.sum(dim=1)
    return row_loss.sum(dim=1) / n.clamp(min=1).to(row_loss.dtype)


def _device_of(net):
    return next(getattr(net, "module", net).parameters()).device


def _targets_counted(targets, real, ignore_index):
    """Rows that count: real (not padding) and, unless ignore_index is None, target != ignore_index."""
    return real if ignore_index is None else real & (targets != ignore_index)


def _reduced(rows, counted, reduction):
    """Per sequence: the mean over its counted rows (B,), or with reduction="sum" (sums (B,), counts (B,))."""
    if reduction == "sum":
        return rows.sum(dim=1), counted.sum(dim=1).to(rows.dtype)
    return _sequence_means(rows, counted)


def lm_losses(net, samples, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """``lm_loss`` for a batch: per sample (ids, or (inputs, targets)) the mean next-token
    cross-entropy over its counted targets; returns (B,), or with reduction="sum" (summed losses (B,),
    counted targets (B,)) as ``lm_loss(..., reduction="sum")`` gives per sample."""
    pairs = [s if isinstance(s, tuple) else (s[:-1], s[1:]) for s in samples]
    dev = _device_of(net)
    ids, real = _pad([p[0] for p in pairs], 0, dev)                    # (B, T) right-padded inputs
    targets, _ = _pad([p[1] for p in pairs], 0, dev)
    counted = _targets_counted(targets, real, ignore_index)
    rows = cross_entropy_per_row(net(ids), targets, counted, label_smoothing)   # (B, T)
    return _reduced(rows, counted, reduction)


def sample_lm(net, bos_id, eos_id, n, max_new, batch=250, generator=None, temperature=1.0):
    """n ancestral samples from a TorchLM, ``batch`` prefixes advanced together (the core's ``generate`` draws
    one at a time): at each step p = softmax(logits[:, -1] / temperature) of every row's prefix, the next id
    drawn from p by ``torch.multinomial`` with ``generator``; a row that has drawn <eos> keeps appending <eos>
    (causal attention: its prefix's rows never see them) and is cut there.  Runs under ``torch.no_grad`` in
    eval mode (no dropout).  -> [(ids after <bos>, without <eos>; True if it ended with <eos>)]."""
    was_training, out = net.training, []
    net.eval()
    dev = _device_of(net)
    try:
        with torch.no_grad():
            for start in range(0, n, batch):
                ids = torch.full((min(batch, n - start), 1), bos_id, dtype=torch.long, device=dev)   # (B, 1)
                done = torch.zeros(ids.shape[0], dtype=torch.bool, device=dev)
                for _ in range(max_new):
                    p = torch.softmax(net(ids)[:, -1, :] / temperature, dim=-1)     # (B, V), the net's dtype
                    nxt = torch.multinomial(p.cpu(), 1, generator=generator)[:, 0].to(dev)
                    nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                    ids = torch.cat([ids, nxt[:, None]], dim=1)
                    done |= nxt == eos_id
                    if bool(done.all()):
                        break
                for row in ids[:, 1:].tolist():
                    out.append((row[:row.index(eos_id)], True) if eos_id in row else (row, False))
    finally:
        net.train(was_training)
    return out


def seq2seq_losses(net, samples, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """``seq2seq_loss`` for a batch of (src, tgt) pairs, tgt = [bos, ..., eos]; returns (B,) (reduction="sum":
    summed losses and counted targets, as ``lm_losses``)."""
    dev = _device_of(net)
    pad_id = getattr(net, "module", net).config["src_pad_id"]
    src, src_real = _pad([s for s, _ in samples], 0 if pad_id is None else pad_id, dev)   # (B, S)
    tgt_in, real = _pad([t[:-1] for _, t in samples], 0, dev)          # (B, T)
    targets, _ = _pad([t[1:] for _, t in samples], 0, dev)
    counted = _targets_counted(targets, real, ignore_index)
    rows = cross_entropy_per_row(net(src, tgt_in, ~src_real), targets, counted, label_smoothing)
    return _reduced(rows, counted, reduction)


def regression_losses(net, samples):
    """``regression_loss`` for a batch of (ids, y): per sample the mean over n_out of (pred - y)^2."""
    dev = _device_of(net)
    pad_id = getattr(net, "module", net).config["pad_id"]
    ids, real = _pad([s[0] for s in samples], 0 if pad_id is None else pad_id, dev)
    ys = [list(y) if isinstance(y, (list, tuple)) else [y] for _, y in samples]
    pred = net(ids, ~real)                                              # (B, n_out)
    y = torch.tensor(ys, dtype=pred.dtype, device=dev)
    diff = pred - y
    return (diff * diff).sum(dim=1) / diff.shape[1]


_LOSSES = {core.lm_loss: lm_losses, core.seq2seq_loss: seq2seq_losses, core.regression_loss: regression_losses,
           "lm": lm_losses, "seq2seq": seq2seq_losses, "regression": regression_losses}


def batch_loss(loss):
    """Our per-sample loss (core.lm_loss etc., a functools.partial of one with ignore_index /
    label_smoothing, or "lm" / "seq2seq" / "regression") -> its batched torch version
    f(net, samples) -> (B,).  Any other callable is taken to be such an f already."""
    if isinstance(loss, functools.partial) and loss.func in _LOSSES:
        return functools.partial(_LOSSES[loss.func], *loss.args, **loss.keywords)
    if isinstance(loss, str) or loss in _LOSSES:
        return _LOSSES[loss]
    return loss


# =====================================================================================
# 5. Training: transformer.train's recipe; checkpoints; DistributedDataParallel under torchrun
# =====================================================================================


def _distributed():
    """(rank, world size, device or None).  Started by torchrun (RANK and WORLD_SIZE set), this
    joins the process group: nccl on CUDA (one GPU per local rank), gloo on CPU."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, None
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = None
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def _all_reduce(x, world):
    """Sum a float over the ranks (identity in one process)."""
    if world == 1:
        return x
    import torch.distributed as dist
    t = torch.tensor([x], dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return float(t[0])


def _share(batch, rank, world):
    """This rank's contiguous part of a global batch (may be empty when the batch is small)."""
    n = len(batch)
    return batch[rank * n // world:(rank + 1) * n // world]


def _grad_step(net, loss_fn, data, batch, rank, world, reduction="sample"):
    """Backward of this rank's part of the batch-mean loss; DDP averages over the ranks, hence the
    factor world / B.  Returns the mean loss of the global batch (a float).  ``reduction="token"``: the
    batch's summed token losses over its counted targets, both from the loss (reduction="sum"), the
    counts summed over the ranks."""
    share = _share(batch, rank, world)
    items = [data[i] for i in share] or [data[batch[0]]]               # an empty share still joins the
    if reduction == "token":                                            # all-reduce, with zero weight
        sums, counts = loss_fn(net, items, reduction="sum")             # (B_r,), (B_r,)
        keep = 1.0 if share else 0.0
        n_total = max(1.0, _all_reduce(float(counts.sum()) * keep, world))
        (sums.sum() * (keep * world / n_total)).backward()              # grad = SUM over tokens / N
        return _all_reduce(float(sums.detach().sum()) * keep, world) / n_total
    per = loss_fn(net, items)
    weight = world / len(batch) if share else 0.0
    (per.sum() * weight).backward()                                     # grad = mean over the batch
    return _all_reduce(float(per.detach().sum()) if share else 0.0, world) / len(batch)


def _train_step(net, opt, loss_fn, data, batch, step, lr, warmup, clip, rank, world, marker=None,
                reduction="sample"):
    """One optimiser step on a global batch: mean gradient, global-norm clipping with factor
    min(1, clip / (norm + 1e-6)), eq. (8.3), then Adam at warmup_inv_sqrt_lr(step).  -> history record.
    ``marker["updating"]`` is set True just before Adam changes the weights (a Ctrl-C from then until
    the caller records the step must not be checkpointed)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    opt.zero_grad(set_to_none=False)
    loss = _grad_step(net, loss_fn, data, batch, rank, world, reduction)
    for p in params:
        if p.grad is None:                                              # unused by this batch: zero
            p.grad = torch.zeros_like(p)                                # gradient (our Adam still steps)
    gnorm = float(torch.sqrt(sum((p.grad * p.grad).sum() for p in params)))   # norm of the mean gradient
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {step}")
    coef = min(1.0, clip / (gnorm + 1e-6)) if clip else 1.0
    if coef < 1.0:
        for p in params:
            p.grad.mul_(coef)
    cur_lr = core.warmup_inv_sqrt_lr(step, lr, warmup)
    for group in opt.param_groups:
        group["lr"] = cur_lr
    if marker is not None:
        marker["updating"] = True                                       # weights ahead of the position
    opt.step()
    return {"step": step, "loss": loss, "lr": cur_lr, "grad_norm": gnorm}


def _eval_loss(module, loss_fn, data, batch_size, rank, world, reduction="sample"):
    """Mean per-sample loss over ``data`` (no gradient), or with reduction="token" the summed token losses
    over the counted targets; each rank takes its share of every batch."""
    total, count = 0.0, 0.0
    with torch.no_grad():
        for s in range(0, len(data), batch_size):
            share = _share(list(range(s, min(s + batch_size, len(data)))), rank, world)
            if share and reduction == "token":
                sums, counts = loss_fn(module, [data[i] for i in share], reduction="sum")
                total, count = total + float(sums.sum()), count + float(counts.sum())
            elif share:
                total += float(loss_fn(module, [data[i] for i in share]).sum())
    count = _all_reduce(count, world) if reduction == "token" else len(data)
    return _all_reduce(total, world) / max(1.0, count)


def _optimizer(module, lr, betas, eps, weight_decay):
    """torch.optim.Adam (our Adam, eqs. 7.7-7.8), or AdamW when weight_decay > 0 (ours is decoupled)."""
    cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
    return cls(module.parameters(), lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


def _fingerprint(module, settings, loss, train_data, valid_data):
    """What a checkpoint must match: class, config, settings (all but max_steps: a run stopped by
    max_steps may be continued with another), the loss, and a sha256 of the data."""
    data = json.dumps([train_data, valid_data or []], default=repr, separators=(",", ":")).encode()
    name = getattr(getattr(loss, "func", loss), "__qualname__", repr(loss))
    keys = sorted((getattr(loss, "keywords", None) or {}).items())
    return {"class": module.kind, "config": module.config,
            "settings": {k: v for k, v in settings.items() if k != "max_steps"},
            "loss": f"{name}{keys}", "data_sha256": hashlib.sha256(data).hexdigest()}


class _Checkpoint:
    """torch.save / torch.load of everything a run needs to continue bit-identically: weights, Adam
    state, the shuffling rng, the position in the epoch and the history.  Rank 0 writes (atomically)."""

    FORMAT = "chem-transformer-torch-checkpoint"

    def __init__(self, path, every, fingerprint, module, opt, rng, rank, world):
        self.path, self.every, self.fingerprint = path, every, fingerprint
        self.module, self.opt, self.rng, self.rank, self.world = module, opt, rng, rank, world
        self.last = time.perf_counter()

    def save(self, prog, history, elapsed, barrier=True):
        if self.rank == 0:
            buf = io.BytesIO()
            torch.save({"format": self.FORMAT, "version": 1, "fingerprint": self.fingerprint,
                        "model": self.module.state_dict(), "optimizer": self.opt.state_dict(),
                        "rng": self.rng.getstate(), "progress": prog, "history": history,
                        "elapsed": elapsed}, buf)
            safe_io.atomic_write(self.path, buf.getvalue())
        if self.world > 1 and barrier:
            torch.distributed.barrier()                                 # nobody runs ahead of the file
        self.last = time.perf_counter()

    def due(self):
        return time.perf_counter() - self.last >= self.every

    def load(self):
        """Restore model, optimiser and rng; returns (progress, history, elapsed)."""
        try:
            obj = _torch_load(self.path, "a torch_bridge checkpoint", _device_of(self.module))
        except TorchFormatError as e:
            raise core.CheckpointMismatchError(f"checkpoint {e}; delete it to start afresh") from None
        if not isinstance(obj, dict) or obj.get("format") != self.FORMAT or obj.get("version") != 1:
            raise core.CheckpointMismatchError(f"{self.path} is not a version-1 torch_bridge checkpoint")
        old, new = obj["fingerprint"], self.fingerprint
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if diff:
            raise core.CheckpointMismatchError(f"checkpoint {self.path} was written for a different run "
                                             f"(differs in {', '.join(diff)}); delete it or pass another path")
        self.module.load_state_dict(obj["model"])
        self.opt.load_state_dict(obj["optimizer"])
        version, state, gauss = obj["rng"]
        self.rng.setstate((version, tuple(state), gauss))
        return obj["progress"], obj["history"], obj["elapsed"]


def _setup(module):
    """(rank, world, net): joins torchrun's process group if started by it, moves the module to this
    rank's GPU under nccl, and wraps it in DistributedDataParallel."""
    rank, world, device = _distributed()
    if "WORLD_SIZE" not in os.environ:
        return rank, world, module
    if device is not None:
        module.to(device)
    ddp = nn.parallel.DistributedDataParallel(module, device_ids=[device] if device is not None else None,
                                              broadcast_buffers=False)
    return rank, world, ddp


def _begin(module, opt, rng, settings, loss, train_data, valid_data, checkpoint, every, rank, world):
    """(checkpoint or None, progress, history, elapsed): a fresh start, or the state of the checkpoint
    file when it exists (model, Adam and rng restored in place)."""
    history = {"settings": settings, "steps": [], "epochs": []}
    # where the loop stands: the next step and epoch, its data order (None: not shuffled yet), next batch
    prog = {"step": 0, "epoch": 1, "order": None, "pos": 0, "ep_loss": 0.0, "ep_batches": 0}
    if not checkpoint:
        return None, prog, history, 0.0
    ck = _Checkpoint(checkpoint, every, _fingerprint(module, settings, loss, train_data, valid_data),
                     module, opt, rng, rank, world)
    if not os.path.exists(checkpoint):
        return ck, prog, history, 0.0
    prog, old, elapsed = ck.load()
    history.update(steps=old["steps"], epochs=old["epochs"],
                   resumed_at_steps=old.get("resumed_at_steps", []) + [prog["step"]])
    return ck, prog, history, elapsed


def _epoch_record(epoch, prog, module, loss_fn, valid_data, settings, epoch_fn, log, rank, world):
    """An epoch's history record: mean train loss over its steps, validation loss, task metrics."""
    rec = {"epoch": epoch, "train_loss": prog["ep_loss"] / max(1, prog["ep_batches"]), "steps": prog["step"]}
    if valid_data:
        rec["valid_loss"] = _eval_loss(module, loss_fn, valid_data, settings["batch_size"], rank, world,
                                       settings.get("loss_reduction", "sample"))
    if epoch_fn is not None:
        rec.update(epoch_fn(module, epoch) or {})
    return dict(rec, elapsed=log.elapsed())


def train_torch(module, train_data, loss, *, valid_data=None, epochs=1, batch_size=8, lr=2e-3, warmup=150,
                clip=1.0, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, seed=0, max_steps=None,
                log_every=None, epoch_fn=None, verbose=True, tag="train", checkpoint=None,
                checkpoint_every=60.0, loss_reduction="sample", augment=None):
    """``transformer.train``'s recipe for a bridged module, in place; returns the same history dict.

    Per epoch the sample order is random.Random(seed).shuffle(range(n)); batches of ``batch_size`` in
    that order; the step's loss is the mean over the batch of the per-sample losses (``loss`` is one of
    our loss functions, a partial of one, or a batched f(net, samples) -> (B,)); its gradient (the mean
    gradient) has its global norm clipped to ``clip``; then one torch.optim.Adam step (AdamW with
    weight_decay) at warmup_inv_sqrt_lr(step, lr, warmup).  History: per-step loss, lr and grad_norm;
    per-epoch train_loss, valid_loss, epoch_fn(module, epoch)'s metrics, elapsed.

    Started by torchrun, every rank runs this with the same arguments: the model is wrapped in
    DistributedDataParallel, each rank computes its contiguous share of every global batch, and the
    all-reduced gradient is the one-process gradient of that batch (equal up to rounding).

    ``checkpoint=path``: rank 0 writes model, Adam state, shuffling rng, position and history with
    torch.save every ``checkpoint_every`` seconds, at the end of every epoch, when the call ends and on
    Ctrl-C (unless it came while Adam was changing the weights; the KeyboardInterrupt is re-raised);
    calling again with the same arguments (``max_steps`` may differ) resumes bit-identically.  A run
    stopped mid-epoch by ``max_steps`` returns that epoch's record marked "partial"; the checkpoint
    keeps the epoch open, so the resumed run's history equals an uninterrupted run's.

    ``loss_reduction="token"`` (language models, seq2seq): the step's loss is the batch's summed token
    losses over its counted targets, instead of the mean of the per-sequence means (eq. 6.4 per sequence).
    ``epoch_fn`` may return {"stop": True} to end the run after that epoch (early stopping).
    ``augment(i, rng) -> sample``: the training sample i as seen this epoch (a fresh randomized spelling,
    say), with rng = random.Random(f"{seed}:{epoch}:{i}"), so a run (and a resumed one) is reproducible.
    Dropout (a module built with a rate > 0) is on during the steps only (``module.train()``), its masks
    drawn after torch.manual_seed(seed, step); validation and ``epoch_fn`` run in ``module.eval()``.
    """
    rank, world, net = _setup(module)
    opt, rng = _optimizer(module, lr, betas, eps, weight_decay), random.Random(seed)
    steps_per_epoch = math.ceil(len(train_data) / batch_size)
    settings = _torch_settings(locals(), world)
    ck, prog, history, elapsed0 = _begin(module, opt, rng, settings, loss, train_data, valid_data, checkpoint,
                                         checkpoint_every, rank, world)
    log = _Logger(tag, verbose and rank == 0, time.perf_counter() - elapsed0,
                  log_every or max(1, steps_per_epoch // 5))
    run = _TorchRun(net, module, opt, batch_loss(loss), rng, train_data, valid_data, settings, ck, prog,
                    history, log, epoch_fn, rank, world)
    run.augment = augment
    if prog["step"]:
        log(f"resuming from {checkpoint} at step {prog['step']}/{run.total_steps}")
    restore_sigterm = core.sigterm_as_ctrl_c()                            # SIGTERM stops the run as Ctrl-C does
    try:
        partial = run.loop()
    except KeyboardInterrupt:
        run.interrupted()
        raise
    finally:
        restore_sigterm()
    if ck:
        ck.save(prog, history, log.elapsed())
    return dict(history, epochs=history["epochs"] + ([partial] if partial else []),
                wall_time=log.elapsed(), n_steps=prog["step"])


def _torch_settings(args, world):
    """``train_torch``'s settings (history, checkpoint fingerprint), its arguments checked: ValueError for
    empty training data or an unknown loss_reduction, TypeError for an augment that is not a function.
    loss_reduction and augment are recorded only when set, so older checkpoints still resume."""
    if not args["train_data"]:
        raise ValueError("train_torch: train_data is empty")
    if args["loss_reduction"] not in ("sample", "token"):
        raise ValueError(f"train_torch: loss_reduction must be 'sample' or 'token', got {args['loss_reduction']!r}")
    if args["loss_reduction"] == "token" and "reduction" not in inspect.signature(batch_loss(args["loss"])).parameters:
        raise TypeError(f"train_torch: loss_reduction='token' needs a loss that reports its counted targets "
                        f"(lm or seq2seq, reduction='sum'), got {args['loss']!r}")
    if args["augment"] is not None and not callable(args["augment"]):
        raise TypeError(f"train_torch: augment must be a function (i, rng) -> sample, got {args['augment']!r}")
    settings = {k: args[k] for k in ("epochs", "batch_size", "lr", "warmup", "clip", "weight_decay")}
    settings.update(betas=list(args["betas"]), eps=args["eps"], seed=args["seed"], max_steps=args["max_steps"],
                    n_train=len(args["train_data"]), n_valid=len(args["valid_data"] or []), world_size=world,
                    schedule="warmup_inv_sqrt")
    if args["loss_reduction"] != "sample":
        settings["loss_reduction"] = args["loss_reduction"]
    if args["augment"] is not None:
        settings["augment"] = _callable_name(args["augment"])
    return settings


class _TorchRun:
    """Where one train_torch call stands: the loop over epochs and batches, its history and its
    checkpoints (``prog`` is the position, as in _begin; ``marker`` says whether a step is half-done)."""

    def __init__(self, net, module, opt, loss_fn, rng, data, valid_data, settings, ck, prog, history, log,
                 epoch_fn, rank, world):
        self.net, self.module, self.opt, self.loss_fn, self.rng = net, module, opt, loss_fn, rng
        self.data, self.valid_data, self.s, self.ck, self.prog = data, valid_data, settings, ck, prog
        self.history, self.log, self.epoch_fn, self.rank, self.world = history, log, epoch_fn, rank, world
        per_epoch = math.ceil(len(data) / settings["batch_size"])
        self.total_steps = per_epoch * settings["epochs"]
        if settings["max_steps"] is not None:
            self.total_steps = min(settings["max_steps"], self.total_steps)
        self.marker = {"updating": False}

    def epoch_record(self, epoch):
        return _epoch_record(epoch, self.prog, self.module, self.loss_fn, self.valid_data,
                             self.s, self.epoch_fn, self.log, self.rank, self.world)

    def loop(self):
        """Epochs until done or max_steps; returns the partial epoch's record (or None)."""
        prog, n = self.prog, len(self.data)
        while prog["epoch"] <= self.s["epochs"] and prog["step"] < self.total_steps:
            epoch = prog["epoch"]
            if prog["order"] is None:                                   # a new epoch: shuffle
                order = list(range(n))
                self.rng.shuffle(order)
                prog.update(order=order, pos=0, ep_loss=0.0, ep_batches=0)
            self.batches(epoch)
            if prog["pos"] < n:                                         # stopped by max_steps mid-epoch
                return dict(self.epoch_record(epoch), partial=True)
            self.history["epochs"].append(self.epoch_record(epoch))
            prog.update(epoch=epoch + 1, order=None, pos=0)
            if self.ck:
                self.ck.save(prog, self.history, self.log.elapsed())
            self.log.epoch(self.history["epochs"][-1], self.s["epochs"])
            if self.history["epochs"][-1].get("stop"):                  # epoch_fn asked to end here
                break
        return None

    def batches(self, epoch):
        """The rest of this epoch's batches (up to total_steps), one optimiser step each."""
        prog, s, bs = self.prog, self.s, self.s["batch_size"]
        data = _Augmented(self.data, self.augment, s["seed"], epoch) if self.augment else self.data
        drops = _has_dropout(self.module)
        for start in range(prog["pos"], len(self.data), bs):
            if prog["step"] >= self.total_steps:
                break
            if drops:                                                   # this step's masks: from (seed, step)
                torch.manual_seed(s["seed"] * 1_000_003 + prog["step"] + 1)
            self.module.train()
            try:
                rec = _train_step(self.net, self.opt, self.loss_fn, data, prog["order"][start:start + bs],
                                  prog["step"] + 1, s["lr"], s["warmup"], s["clip"], self.rank, self.world,
                                  self.marker, s.get("loss_reduction", "sample"))
            finally:
                self.module.eval()
            self.history["steps"].append(dict(rec, epoch=epoch))
            prog.update(step=rec["step"], pos=start + bs, ep_loss=prog["ep_loss"] + rec["loss"],
                        ep_batches=prog["ep_batches"] + 1)
            self.marker["updating"] = False                             # weights and position agree again
            self.log.step(rec, epoch, s["epochs"], self.total_steps)
            if self.ck and self.ck.due():
                self.ck.save(prog, self.history, self.log.elapsed())

    def interrupted(self):
        """Ctrl-C: checkpoint where the run stands (rank 0, no barrier), unless in mid-update."""
        if not self.ck:
            return
        if self.marker["updating"]:
            self.log(f"interrupted during step {self.prog['step'] + 1}'s update: the checkpoint "
                     f"{self.ck.path} keeps the state of its last save")
            return
        self.ck.save(self.prog, self.history, self.log.elapsed(), barrier=False)
        self.log(f"interrupted at step {self.prog['step']}: saved {self.ck.path}; "
                 f"the same call resumes from it")


class _Augmented:
    """The training data as one epoch sees it: item i is augment(i, random.Random(f"{seed}:{epoch}:{i}"))."""

    def __init__(self, data, augment, seed, epoch):
        self.data, self.augment, self.seed, self.epoch = data, augment, seed, epoch

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.augment(i, random.Random(f"{self.seed}:{self.epoch}:{i}"))


def _has_dropout(module):
    """True when any part of ``module`` drops (a dropout rate > 0 in its config)."""
    return float(getattr(module, "config", {}).get("dropout", 0.0) or 0.0) > 0.0


def _callable_name(fn):
    return getattr(getattr(fn, "func", fn), "__qualname__", repr(fn))


class _Logger:
    """train_torch's progress lines (rank 0 only), in transformer.train's format."""

    def __init__(self, tag, on, t0, every):
        self.tag, self.on, self.t0, self.every = tag, on, t0, every

    def elapsed(self):
        return time.perf_counter() - self.t0

    def __call__(self, text):
        if self.on:
            print(f"[{self.tag}] {text}", flush=True)

    def step(self, rec, epoch, epochs, total_steps):
        if rec["step"] % self.every == 0 or rec["step"] == total_steps:
            self(f"epoch {epoch}/{epochs} step {rec['step']}/{total_steps} loss {rec['loss']:.4f} "
                 f"lr {rec['lr']:.2e} |g| {rec['grad_norm']:.3f} elapsed {self.elapsed():.1f}s")

    def epoch(self, rec, epochs):
        extra = " ".join(f"{k} {v:.4f}" for k, v in rec.items()
                         if k not in ("epoch", "steps", "elapsed") and isinstance(v, float))
        self(f"end of epoch {rec['epoch']}/{epochs}: {extra}")


# =====================================================================================
# 6. Files and the command line
# =====================================================================================

TORCH_FORMAT = "chem-transformer-torch"


def save_torch(module, path, meta=None):
    """torch.save the module's class name, config, state_dict (our Param names) and meta, atomically."""
    module = getattr(module, "module", module)
    buf = io.BytesIO()
    torch.save({"format": TORCH_FORMAT, "version": 1, "class": module.kind, "config": module.config,
                "state_dict": module.state_dict(), "meta": meta or {}}, buf)
    safe_io.atomic_write(path, buf.getvalue())


class TorchFormatError(ValueError):
    """A file that ``load_torch`` cannot read: missing pieces, not a torch file, empty, another format, an
    empty or mismatched state_dict, a bad config.  The message names the file and what is wrong."""


def _torch_load(path, what, map_location="cpu"):
    """torch.load(path) with weights_only=True (no code in the file is ever run), refusing a file over
    core.MAX_MODEL_FILE_MB before reading it.  A file torch cannot read raises TorchFormatError with our
    own reason: torch's message advises weights_only=False, which must never be followed for a file of
    unknown origin."""
    size = os.path.getsize(path)                                        # FileNotFoundError names the file
    if size > core.MAX_MODEL_FILE_MB * 2 ** 20:
        raise TorchFormatError(f"{path} is {size / 2 ** 20:,.0f} MB, over the limit of {core.MAX_MODEL_FILE_MB} MB "
                               f"for {what}; nothing was read")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception:                                                   # UnpicklingError, RuntimeError, EOFError
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
        why = ("it is empty" if size == 0 else "it looks like JSON (a transformer.py model file?)"
               if head[:1] in (b"{", b"[") else "torch.load cannot read it as a file of tensors")
        raise TorchFormatError(f"{path} is not {what} ({why})") from None


def _tensor_problem(name, t):
    """What makes tensor ``t`` no weight that load_model would take ('' if nothing): a sparse or other
    non-dense layout, a dtype that is not a real floating-point one (ints, bool, complex), a NaN or an
    infinity.  (Its shape is checked against the config after.)"""
    if t.layout != torch.strided:
        return f"weight {name!r} is a {str(t.layout).replace('torch.', '')} tensor, not a dense one"
    if not t.is_floating_point():
        return f"weight {name!r} has dtype {str(t.dtype).replace('torch.', '')}, not a real floating-point type"
    if not bool(torch.isfinite(t).all()):
        return f"weight {name!r} holds NaN or infinite values"
    return ""


def _json_problem(value, where="meta"):
    """Where ``value`` (a file's meta) is not plain JSON that save_model can write ('' if nowhere): a key
    that is not a string, a non-finite number, or any other object (a tensor)."""
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            return f"{where} has a key {bad[0]!r} that is not a string"
        return next((p for k, v in value.items() if (p := _json_problem(v, f"{where}.{k}"))), "")
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := _json_problem(v, f"{where}[{i}]"))), "")
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value!r}, not a finite number"
    if value is None or isinstance(value, (str, bool, int, float)):
        return ""
    return f"{where} is a {type(value).__name__}, not a JSON value"


def _check_torch_file(path, state, kind, config, meta):
    """TorchFormatError naming the file unless its pieces can become a transformer.py model file: the
    state_dict a non-empty dict of dense, finite, real floating-point tensors; the class ours; the config
    what load_model accepts (``transformer.check_model_config``: every field known, sizes positive ints,
    within the parameter limit); the meta plain JSON."""
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TorchFormatError(f"{path}: its state_dict is empty or not a dict of tensors")
    if kind not in TORCH_CLASSES or not isinstance(config, dict):
        raise TorchFormatError(f"{path}: unknown model class {kind!r} or a config that is not a dict")
    problem = next((p for name, t in state.items() if (p := _tensor_problem(name, t))), "")
    if problem:
        raise TorchFormatError(f"{path}: {problem}")
    try:
        core.check_model_config(path, OUR_CLASSES[kind], config)
    except core.ModelFormatError as e:
        raise TorchFormatError(str(e).replace("load_model: ", "", 1)) from None
    problem = _json_problem(meta) if isinstance(meta, dict) else f"meta is a {type(meta).__name__}, not a dict"
    if problem:
        raise TorchFormatError(f"{path}: {problem}")


def load_torch(path):
    """(module, meta) from a file written by save_torch; the module has the saved dtype.  Every problem
    with the file raises TorchFormatError naming it (a missing file: FileNotFoundError): the checks of
    ``_check_torch_file`` (load_model's, on the config and every tensor), then the tensors' shapes against
    the config, on a module built on torch's "meta" device, so that a misfit allocates nothing."""
    obj = _torch_load(path, f"a {TORCH_FORMAT} file (save_torch, torch_bridge.py export)")
    if not isinstance(obj, dict) or obj.get("format") != TORCH_FORMAT or obj.get("version") != 1:
        raise TorchFormatError(f"{path} is not a version-1 {TORCH_FORMAT} file (save_torch, torch_bridge.py export)")
    state, kind, config = obj.get("state_dict"), obj.get("class"), obj.get("config")
    _check_torch_file(path, state, kind, config, obj.get("meta", {}))
    try:
        with torch.device("meta"):                                      # shapes only: nothing is allocated
            shapes = {k: tuple(v.shape) for k, v in build_torch(kind, config).state_dict().items()}
    except (TypeError, KeyError, ValueError) as e:
        raise TorchFormatError(f"{path}: bad config for {kind} ({e})") from None
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != shapes:
        bad = sorted(k for k in set(got) | set(shapes) if got.get(k) != shapes.get(k))
        raise TorchFormatError(f"{path}: the state_dict does not fit its config ({bad[:5]}: "
                               f"{[got.get(k) for k in bad[:5]]} vs {[shapes.get(k) for k in bad[:5]]})")
    module = build_torch(kind, config, dtype=next(iter(state.values())).dtype)
    module.load_state_dict(state, strict=True)
    return module, obj.get("meta", {})


def _export(args):
    safe_io.check_output(args.out_pt, inputs=[args.model_json])      # before any work
    model = core.load_model(args.model_json)
    with open(args.model_json, encoding="utf-8") as f:
        meta = json.load(f).get("meta", {})
    save_torch(to_torch(model, getattr(torch, args.dtype)), args.out_pt, meta)
    print(f"{args.model_json} -> {args.out_pt} ({type(model).__name__}, {core.param_count(model)} parameters)")


def _import(args):
    safe_io.check_output(args.out_json, inputs=[args.in_pt])         # before any work
    module, meta = load_torch(args.in_pt)
    try:
        model = from_torch(module)
    except (TypeError, ValueError) as e:                           # a config our class refuses
        raise TorchFormatError(f"{args.in_pt}: bad config for {module.kind} ({e})") from None
    core.save_model(model, args.out_json, meta=meta)
    print(f"{args.in_pt} -> {args.out_json} ({module.kind})")


def main(argv=None):
    """The command line.  A user mistake (a missing or wrong kind of file, an empty torch file, an output
    that is the input or whose folder does not exist) is one line on stderr and exit status 2."""
    ap = argparse.ArgumentParser(description="Convert models between transformer.py's JSON files and torch files.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="JSON model (save_model) -> torch file (torch.save)")
    ex.add_argument("model_json")
    ex.add_argument("out_pt", help="the torch file to write; its folder must exist")
    ex.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    im = sub.add_parser("import", help="torch file -> JSON model (load_model reads it)")
    im.add_argument("in_pt")
    im.add_argument("out_json", help="the JSON model to write; its folder must exist")
    args = ap.parse_args(argv)
    try:
        (_export if args.cmd == "export" else _import)(args)
    except FileNotFoundError as e:
        print(f"torch_bridge {args.cmd}: {e.filename}: no such file", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:               # ModelFormatError, TorchFormatError, UnsafeOutputError, ...
        print(f"torch_bridge {args.cmd}: {e}".replace("\n", " "), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
