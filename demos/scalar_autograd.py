"""A scalar-autograd Transformer step, micrograd style, for one comparison in demos/bench_core.py.

Every number is a ``Value`` object that records its parents and local derivatives; ``backward()``
walks the graph in reverse topological order.  This is how the smallest educational GPTs (micrograd,
microgpt) differentiate.  ``transformer.py`` instead writes each layer's backward by hand over lists
of rows; timing both on the same model shape in the same run shows what that buys.

The model is the same architecture as ``transformer.TransformerLM`` (token + learned position
embedding, Pre-LN blocks with causal multi-head attention and a tanh-GELU FFN, final LayerNorm,
untied head), so the two step times measure the same arithmetic.
"""
import math
import random


class Value:
    """One scalar with its gradient and the local derivatives to its parents."""

    __slots__ = ("data", "grad", "_parents", "_local")

    def __init__(self, data, parents=(), local=()):
        self.data, self.grad, self._parents, self._local = data, 0.0, parents, local

    def __add__(self, o):
        o = o if isinstance(o, Value) else Value(o)
        return Value(self.data + o.data, (self, o), (1.0, 1.0))

    __radd__ = __add__

    def __mul__(self, o):
        o = o if isinstance(o, Value) else Value(o)
        return Value(self.data * o.data, (self, o), (o.data, self.data))

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1.0

    def __sub__(self, o):
        return self + (-o)

    def __pow__(self, k):
        return Value(self.data ** k, (self,), (k * self.data ** (k - 1),))

    def __truediv__(self, o):
        return self * o ** -1

    def exp(self):
        e = math.exp(self.data)
        return Value(e, (self,), (e,))

    def log(self):
        return Value(math.log(self.data), (self,), (1.0 / self.data,))

    def tanh(self):
        t = math.tanh(self.data)
        return Value(t, (self,), (1.0 - t * t,))

    def backward(self):
        order, seen = [], set()
        stack = [(self, False)]
        while stack:                                  # iterative topological sort (deep graphs)
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.append((v, True))
            stack.extend((p, False) for p in v._parents)
        self.grad = 1.0
        for v in reversed(order):
            for p, g in zip(v._parents, v._local):
                p.grad += g * v.grad


def _mat(rng, n, m, std):
    return [[Value(rng.gauss(0.0, std)) for _ in range(m)] for _ in range(n)]


def _linear(X, W, b):
    return [[sum((x * w for x, w in zip(row, col)), b[j]) for j, col in enumerate(zip(*W))] for row in X]


def _layernorm(X, ln):
    g, b = ln
    out = []
    for x in X:
        mu = sum(x, Value(0.0)) * (1.0 / len(x))
        xc = [v - mu for v in x]
        r = (sum((v * v for v in xc), Value(0.0)) * (1.0 / len(x)) + 1e-5) ** -0.5
        out.append([v * r * gi + bi for v, gi, bi in zip(xc, g, b)])
    return out


def _ln_params(d):
    return [Value(1.0) for _ in range(d)], [Value(0.0) for _ in range(d)]


def _gelu(x):
    return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)).tanh())


def _softmax(row):
    m = max(v.data for v in row)
    e = [(v - m).exp() for v in row]
    s = sum(e, Value(0.0))
    return [v / s for v in e]


class ScalarLM:
    """The microgpt-shape TransformerLM with one Value per parameter."""

    def __init__(self, V=27, d=16, H=4, L=1, d_ff=64, T=16, seed=0):
        rng = random.Random(seed)
        self.V, self.d, self.H, self.T = V, d, H, T
        self.wte, self.wpe = _mat(rng, V, d, d ** -0.5), _mat(rng, T, d, 0.02)
        self.layers = [dict(qkv=_mat(rng, d, 3 * d, 0.1), bqkv=[Value(0.0) for _ in range(3 * d)],
                            o=_mat(rng, d, d, 0.1), bo=[Value(0.0) for _ in range(d)],
                            f1=_mat(rng, d, d_ff, 0.1), b1=[Value(0.0) for _ in range(d_ff)],
                            f2=_mat(rng, d_ff, d, 0.1), b2=[Value(0.0) for _ in range(d)],
                            ln1=_ln_params(d), ln2=_ln_params(d)) for _ in range(L)]
        self.ln_f = _ln_params(d)
        self.head, self.bhead = _mat(rng, d, V, 0.1), [Value(0.0) for _ in range(V)]

    def params(self):
        ps = [v for r in self.wte + self.wpe + self.head for v in r] + self.bhead + self.ln_f[0] + self.ln_f[1]
        for ly in self.layers:
            for k in ("qkv", "o", "f1", "f2"):
                ps += [v for r in ly[k] for v in r]
            ps += (ly["bqkv"] + ly["bo"] + ly["b1"] + ly["b2"] + ly["ln1"][0] + ly["ln1"][1]
                   + ly["ln2"][0] + ly["ln2"][1])
        return ps

    def loss(self, ids):
        d, H = self.d, self.H
        dh = d // H
        X = [[a + b for a, b in zip(self.wte[i], self.wpe[t])] for t, i in enumerate(ids[:-1])]
        for ly in self.layers:
            QKV = _linear(_layernorm(X, ly["ln1"]), ly["qkv"], ly["bqkv"])
            O = [[] for _ in X]
            for h in range(H):
                q = [r[h * dh:(h + 1) * dh] for r in QKV]
                k = [r[d + h * dh:d + (h + 1) * dh] for r in QKV]
                v = [r[2 * d + h * dh:2 * d + (h + 1) * dh] for r in QKV]
                for t in range(len(X)):
                    a = _softmax([sum((x * y for x, y in zip(q[t], k[j])), Value(0.0)) * dh ** -0.5
                                  for j in range(t + 1)])
                    O[t] += [sum((a[j] * v[j][c] for j in range(t + 1)), Value(0.0)) for c in range(dh)]
            X = [[a + b for a, b in zip(x, y)] for x, y in zip(X, _linear(O, ly["o"], ly["bo"]))]
            F = _linear([[_gelu(u) for u in r] for r in _linear(_layernorm(X, ly["ln2"]), ly["f1"], ly["b1"])],
                        ly["f2"], ly["b2"])
            X = [[a + b for a, b in zip(x, y)] for x, y in zip(X, F)]
        logits = _linear(_layernorm(X, self.ln_f), self.head, self.bhead)
        nll = [-(_softmax(row)[y].log()) for row, y in zip(logits, ids[1:])]
        return sum(nll, Value(0.0)) * (1.0 / len(nll))

    def step(self, ids, lr=1e-2):
        """One forward + backward + SGD update; returns the loss."""
        params = self.params()
        for p in params:
            p.grad = 0.0
        loss = self.loss(ids)
        loss.backward()
        for p in params:
            p.data -= lr * p.grad
        return loss.data
