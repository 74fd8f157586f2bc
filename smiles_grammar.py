"""The SMILES grammar and valence constraint, why RDKit rejects a string, and SELFIES.

Experiment 4 (the SMILES language model on ESOL) samples molecules and checks them with RDKit; the
tutorial names the typical failures: unbalanced parentheses, ``<unk>`` in the output, unpaired ring
digits.  This module holds the state machine that rules such strings out while sampling, the failure
analysis, and the SELFIES conversion the tutorial offers as a remedy:

    1. the constraint        SmilesConstraint: after each prefix, the token ids that keep the string a
                             SMILES within valences, for ``transformer.generate(constraint=...)``
                             (experiment 4's constrained sampling, experiment 9's constrained beam);
                             SmilesGrammarError for a refused token sequence
    2. failures, SELFIES     smiles_failure_reason (one of FAILURE_REASONS); smiles_to_selfies,
                             selfies_to_smiles (``chemdata.tokenize_selfies`` splits a SELFIES string)
    3. closing partners      closing_partners: the ring / branch partner of each closing token, for
                             experiment 5's attention analysis

Standard library only at module level; RDKit and selfies are imported by the functions that need them.
Callers import this module by name (``import smiles_grammar; smiles_grammar.SmilesConstraint(vocab)``).
"""

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

from chemdata import CHEM_EXTRA_HINT, import_rdkit, quiet_rdkit, canonical_smiles, tokenize_smiles

__all__ = ["SmilesGrammarError", "SmilesConstraint", "FAILURE_REASONS", "smiles_failure_reason",
           "smiles_to_selfies", "selfies_to_smiles", "closing_partners"]


# =====================================================================================
# 1. The SMILES grammar + valence constraint (experiments 4 and 9: constrained sampling)
# =====================================================================================

class SmilesGrammarError(ValueError):
    """A token sequence that the SMILES state machine refuses; carries the tokens and the position."""

    def __init__(self, tokens, position, reason):
        self.tokens, self.position, self.reason = list(tokens), position, reason
        super().__init__(f"token {self.tokens[position]!r} at position {position} of "
                         f"{''.join(map(str, self.tokens))!r} is not allowed: {reason}")


# ----- valence tables

# Largest valence RDKit accepts for a neutral organic-subset atom (it adds implicit H up to an allowed
# valence, so any bond total up to the largest one can be completed: P 3/5, S 2/4/6).
_MAX_VALENCE = {"B": 3, "C": 4, "N": 3, "O": 2, "P": 5, "S": 6, "F": 1, "Cl": 1, "Br": 1, "I": 1,
                "Si": 4, "Se": 6, "As": 5, "Te": 6, "Al": 3, "Ge": 4, "Sn": 4, "Pb": 4, "Hg": 2,
                "Zn": 2, "H": 1, "Li": 1, "Na": 1, "K": 1, "Mg": 2, "Ca": 2}
# Aromatic atoms: bonds inside the ring count 1 each; the capacity is the number of sigma bonds
# (c 3: two ring bonds + one substituent or a third ring bond; n 3 covers pyridine (2) and pyrrole-type
# n with a substituent; o 2; s 2; p 3; b 3).  One exocyclic double bond (c(=O)) costs 1 on the
# aromatic side: its pi electron leaves the ring for the double bond.
_AROMATIC_CAPACITY = {"b": 3, "c": 3, "n": 3, "o": 2, "p": 3, "s": 2, "se": 2, "as": 3}
_AROMATIC_DOUBLE = ("c", "s", "p", "b")        # aromatic atoms that may carry one double bond (c(=O));
                                                # n only to O (the N-oxide n=O)
_BOND_ORDER = {"-": 1, "=": 2, "#": 3, "$": 4, ":": 1, "/": 1, "\\": 1}
_BRACKET = re.compile(r"\[(\d*)([A-Z][a-z]?|[a-z][a-z]?|\*)(@*)(?:H(\d*))?([+-]*\d*)(?::\d+)?\]")
_UNLIMITED = 8


# ----- records: an atom token's kind, an atom of a parse, a parse state

@dataclass(frozen=True)
class _AtomKind:
    """What the state machine knows about an atom token."""
    symbol: str          # element as written ('c', 'Cl', 'n'); '*' for the wildcard
    aromatic: bool
    capacity: int        # bond-order total it can take (aromatic: sigma bonds)
    nitro: bool = False  # neutral aliphatic N: N(=O)=O is accepted (RDKit turns it into [N+](=O)[O-])


class _Atom(NamedTuple):
    """One atom of a parse and the bonds it has so far."""
    kind: _AtomKind
    used: int = 0        # bond-order total (aromatic: sigma bonds), open ring bonds included
    n_double: int = 0    # double bonds
    n_double_o: int = 0  # double bonds to an O (nitro N)
    neighbours: int = 0  # bonded atoms (an open ring bond is not one yet)


class _State(NamedTuple):
    """Parse state after a prefix (transitions build a new one: ``_State(...)`` or ``st._replace(...)``)."""
    prev: str = "start"  # class of the last token: 'start' (after <bos> or '.'), 'atom', 'ring', 'bond',
                         # 'open', 'close', 'end' (after <eos>)
    cur: int = None      # index of the current atom (where the next bond starts); None at a start
    pending: int = None  # order of a bond token still waiting for its atom or ring bond
    stack: tuple = ()    # the atoms the open branches hang from, innermost last
    rings: tuple = ()    # open ring bonds, sorted: ((label, (atom, order or None)), ...)
    atoms: tuple = ()    # one _Atom per atom so far
    edges: frozenset = frozenset()   # bonds as (atom, atom) pairs, ring closures included
    needy: frozenset = frozenset()   # aromatic atoms that still need neighbours (< 2 with open ring bonds)
    ringed: frozenset = frozenset()  # atoms on a cycle (only a ring closure adds cycles)
    owed: bool = False   # max_ring_size with lookahead: a ring closed at the current atom is still too large;
                         # only ring labels (and their bonds) may follow until one cuts it (c1cccc2ccccc12)


# ----- token classes

def _bracket_kind(token):
    """Light parse of a bracket atom -> _AtomKind (element valence, minus H, charge-adjusted)."""
    m = _BRACKET.fullmatch(token)
    if m is None:
        return _AtomKind(token, False, _UNLIMITED)
    symbol, h, charge = m.group(2), m.group(4), m.group(5)
    n_h = 0 if h is None else (int(h) if h else 1)
    q = 0
    if charge:
        digits = charge.lstrip("+-")
        q = (int(digits) if digits else len(charge)) * (1 if charge[0] == "+" else -1)
    aromatic = symbol.islower() and symbol != "*"
    element = symbol.capitalize() if aromatic else symbol
    base = _MAX_VALENCE.get(element)
    if base is None:
        return _AtomKind(symbol, aromatic, _UNLIMITED)
    if element in ("N", "O", "S", "P", "Se", "As"):
        base += q                           # [N+] 4, [O-] 1, [n+] 4
    elif element in ("C", "Si"):
        base -= abs(q)                      # carbocation / carbanion: 3
    elif element == "B":
        base -= q                           # [B-] 4
    cap = base - n_h - (1 if aromatic and element in ("C", "B") else 0)
    return _AtomKind(symbol, aromatic, max(cap, 0))


def _atom_kind(token):
    """_AtomKind of an atom token, or None if ``token`` is not an atom."""
    if token.startswith("[") and token.endswith("]"):
        return _bracket_kind(token)
    if token == "*":
        return _AtomKind("*", False, _UNLIMITED)
    if token in _AROMATIC_CAPACITY:
        return _AtomKind(token, True, _AROMATIC_CAPACITY[token])
    if token in _MAX_VALENCE and token != "H":
        return _AtomKind(token, False, _MAX_VALENCE[token], nitro=(token == "N"))
    return None


def _token_class(token):
    """('atom', kind) | ('bond', order) | ('open',) | ('close',) | ('ring', label) | ('dot',) | ('other',)."""
    kind = _atom_kind(token)
    if kind is not None:
        return ("atom", kind)
    if token in _BOND_ORDER:
        return ("bond", _BOND_ORDER[token])
    if token == "(":
        return ("open",)
    if token == ")":
        return ("close",)
    if len(token) == 1 and token.isdigit() or (len(token) == 3 and token[0] == "%" and token[1:].isdigit()):
        return ("ring", token)
    if token == ".":
        return ("dot",)
    return ("other",)


# ----- valences and bond rules

def _bond_cost(atom, order, partner_o):
    """(used, n_double, n_double_o) of the _Atom ``atom`` once it takes a bond of ``order``, or None if that
    would exceed its valence.  ``partner_o``: the other end is an O (only matters for nitro N)."""
    kind, used, n_double, n_dO, _ = atom
    if kind.aromatic:
        if order > 2 or (order == 2 and (n_double >= 1 or (kind.symbol not in _AROMATIC_DOUBLE and
                                                           not (kind.symbol == "n" and partner_o)))):
            return None
        used += 1
        n_double += order == 2
        return (used, n_double, n_dO) if used <= kind.capacity else None
    used += order
    n_double += order == 2
    n_dO += order == 2 and partner_o
    if used <= kind.capacity:
        return used, n_double, n_dO
    if kind.nitro and used <= 5 and n_dO >= 2:
        return used, n_double, n_dO
    return None


def _aromatic_double_ok(a, b):
    """An explicit '=' touching an aromatic atom only to a non-aromatic O or S (c=O, c=S: the only ones in
    ESOL): RDKit rejects most others (C=c, c=c, c=N inside rings) at kekulization."""
    if not (a.aromatic or b.aromatic):
        return True
    return a.aromatic != b.aromatic and (b if a.aromatic else a).symbol in ("O", "S")


def _update_needy(needy, touched, atoms, rings):
    """The set of aromatic atoms with fewer than two neighbours (open ring bonds count), after the atoms
    in ``touched`` changed."""
    out = set(needy)
    for a in touched:
        if a is None:
            continue
        kind, _, _, _, neighbours = atoms[a]
        if kind.aromatic and neighbours + sum(1 for _, (i, _) in rings if i == a) < 2:
            out.add(a)
        else:
            out.discard(a)
    return frozenset(out)


# ----- rings and aromatic systems

def _shortest_path(edges, a, b):
    """Atom indices of a shortest path a .. b over ``edges`` (pairs), or None.  Not memoized: equal edge sets
    built in different orders may break ties differently, and an answer must depend on its prefix alone."""
    adjacent = {}
    for x, y in edges:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    previous, frontier = {a: None}, [a]
    while frontier and b not in previous:
        nxt = []
        for x in frontier:
            for y in adjacent.get(x, ()):
                if y not in previous:
                    previous[y] = x
                    nxt.append(y)
        frontier = nxt
    if b not in previous:
        return None
    path = [b]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path


_DISTANCES_CACHE = {}


def _distances(edges, source):
    """{atom: bonds on a shortest path from ``source``} over ``edges`` (a frozenset of pairs): breadth-first
    search, memoized by (edges, source): the atom candidates of one decoding step share their edges (the new
    atom's index is the same for all), and distances only shrink as bonds are added."""
    key = (edges, source)
    got = _DISTANCES_CACHE.get(key)
    if got is not None:
        return got
    if len(_DISTANCES_CACHE) > 50_000:
        _DISTANCES_CACHE.clear()
    adjacent = {}
    for x, y in edges:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    got, frontier = {source: 0}, [source]
    while frontier:
        nxt = []
        for x in frontier:
            for y in adjacent.get(x, ()):
                if y not in got:
                    got[y] = got[x] + 1               # dist(source, y) = dist(source, x) + 1 on a BFS tree edge
                    nxt.append(y)
        frontier = nxt
    _DISTANCES_CACHE[key] = got
    return got


def _ring_size_ok(edges, a, b, max_ring_size):
    """A ring closure a-b makes a ring of at most ``max_ring_size`` atoms: size = dist(a, b) + 1, the shortest
    path in bonds over ``edges`` (the graph so far) plus the new bond; a disconnected pair makes none."""
    dist = _distances(edges, a).get(b)
    return dist is not None and dist + 1 <= max_ring_size


def _rings_too_large(edges, max_ring_size):
    """True if the rings of at most ``max_ring_size`` atoms do not span every cycle of the graph ``edges`` (a
    frozenset of pairs): then its smallest set of smallest rings (RDKit's ring information) holds a larger one.
    The short cycles, found by depth-first walks over the bonds on a cycle, as bit sets of bonds; their rank
    over GF(2) against the cycle count E - V + components.  Asked only where a too-large ring closed (``owed``)."""
    ring = _ring_edges(edges)
    adjacent = {}
    for x, y in ring:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    bit = {e: 1 << k for k, e in enumerate(ring)}
    bit.update({(y, x): b for (x, y), b in list(bit.items())})
    basis = {}                                        # leading bit -> vector (XOR elimination)

    def add(vector):
        while vector:
            top = vector.bit_length() - 1
            if top not in basis:
                basis[top] = vector
                return
            vector ^= basis[top]

    def walk(start, node, seen, vector):              # simple paths from start through atoms above it
        for nxt in adjacent[node]:
            if nxt == start and len(seen) >= 3:
                add(vector | bit[node, nxt])
            elif nxt > start and nxt not in seen and len(seen) < max_ring_size:
                walk(start, nxt, seen | {nxt}, vector | bit[node, nxt])
    for start in adjacent:
        walk(start, start, frozenset((start,)), 0)
    parent = {x: x for x in adjacent}                 # components of the ring bonds: union-find

    def root(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for x, y in ring:
        parent[root(x)] = root(y)
    cycles = len(ring) - len(adjacent) + len({root(x) for x in adjacent})
    return len(basis) < cycles


def _chords(st, open_rings, other=None):
    """The bonds the open ring bonds ``open_rings`` ((atom, order) pairs) could still make at the current atom:
    not from the current atom itself, nor ``other`` (the closure being made), nor an atom already bonded to it."""
    cur = st.cur
    return {(i, cur) for i, _ in open_rings
            if i not in (cur, other) and (i, cur) not in st.edges and (cur, i) not in st.edges}


def _close_plan(options, i, left, growing):
    """Backtracking: can rings ``options[i:]`` ((order, [(kind, r), ...]) each) be given closures within the
    capacities ``left`` ({(kind, r): bond orders left}), a chain grown from r (``growing``) taking one
    'direct' valence of r?  Used by SmilesConstraint._rings_closable."""
    if i == len(options):
        return True
    order, opts = options[i]
    for kind, r in opts:
        cost = {(kind, r): order}
        if kind != "direct" and r not in growing:    # kind: "direct" or a chain depth
            cost[("direct", r)] = cost.get(("direct", r), 0) + 1
        if all(left[k] >= n for k, n in cost.items()):
            for k, n in cost.items():
                left[k] -= n
            ok = _close_plan(options, i + 1, left, growing | ({r} if kind != "direct" else set()))
            for k, n in cost.items():
                left[k] += n
            if ok:
                return True
    return False


def _aromatic_ring_ok(atoms, edges, a, b, more_open):
    """A ring closure a-b (b the current atom) whose shortest ring is all aromatic must look
    kekulizable: at least 5 atoms, and at most 6 unless other ring bonds are still open (a fused
    system may close its small rings later); a 5-ring needs a heteroatom unless it is part of a fused
    system; a 6-ring with a pyrrole-type atom (o, s, [nH]) needs an exocyclic double bond on one of its
    atoms (coumarin's c(=O)o), which the current atom may still get.  A cheap filter, not a
    kekulization."""
    path = _shortest_path(edges, a, b)
    if path is None or not all(atoms[i].kind.aromatic for i in path):
        return True
    kinds = [atoms[i].kind for i in path]
    if len(path) < 5 or (len(path) > 6 and not more_open):
        return False
    if len(path) == 5:          # all-carbon 5-rings only inside fused systems (fluoranthene)
        return more_open or any(k.symbol != "c" for k in kinds) or any(atoms[i].neighbours >= 3 for i in path)
    if len(path) > 6:
        return True
    donors = any(k.symbol in ("o", "s", "se") or (k.symbol == "n" and k.capacity == 2) for k in kinds)
    cur = atoms[b]
    may_get_double = cur.kind.symbol in _AROMATIC_DOUBLE and not cur.n_double and cur.used < cur.kind.capacity
    return not donors or may_get_double or any(atoms[i].n_double for i in path)


_BRIDGES_CACHE = {}


def _bridges(edges, ports=None):
    """{bridge: (its endpoint farther from the DFS root, ports on that side, ports in its connected part)}
    for the edges (a frozenset of pairs) on no cycle: Tarjan's low-link, iterative DFS; ``ports`` ({atom:
    count}) weight the sides.  Memoized: the sibling states of one decoding step share edges and ports."""
    key = (edges, frozenset(ports.items()) if ports else None)
    got = _BRIDGES_CACHE.get(key)
    if got is not None:
        return got
    if len(_BRIDGES_CACHE) > 50_000:
        _BRIDGES_CACHE.clear()
    edges_list = list(edges)
    adjacent = {}
    for k, (x, y) in enumerate(edges_list):
        adjacent.setdefault(x, []).append((y, k))
        adjacent.setdefault(y, []).append((x, k))
    weight = ports.get if ports else (lambda a, default: 0)
    order, low, below, counter, out = {}, {}, {}, 0, {}        # below: ports in the DFS subtree
    for root in adjacent:
        if root in order:
            continue
        order[root] = low[root] = counter
        below[root] = weight(root, 0)
        counter += 1
        found = []
        stack = [(root, -1, iter(adjacent[root]))]
        while stack:
            x, via, it = stack[-1]
            for y, k in it:
                if k == via:
                    continue
                if y in order:
                    low[x] = min(low[x], order[y])
                else:
                    order[y] = low[y] = counter
                    below[y] = weight(y, 0)
                    counter += 1
                    stack.append((y, k, iter(adjacent[y])))
                    break
            else:
                stack.pop()
                if stack:
                    parent = stack[-1][0]
                    low[parent] = min(low[parent], low[x])
                    below[parent] += below[x]
                    if low[x] > order[parent]:
                        found.append((via, x))
        for k, child in found:
            out[edges_list[k]] = (child, below[child], below[root])
    _BRIDGES_CACHE[key] = out
    return out


def _ring_edges(edges, ports=None):
    """The edges (a frozenset of pairs) on a cycle; with ``ports`` also the bridges that may still join
    one: ports on both sides."""
    bridges = _bridges(edges, ports)
    return [e for e in edges if e not in bridges or (bridges[e][1] and bridges[e][2] - bridges[e][1])]


def _ports(atoms, reach, rings):
    """Where new bonds can still start: one per open ring bond, and up to two per reachable atom (current
    atom, branch stack) with free valence."""
    ports = Counter(i for _, (i, _) in rings)
    for a in set(reach):
        if a is not None and atoms[a].used < atoms[a].kind.capacity:
            ports[a] += min(2, atoms[a].kind.capacity - atoms[a].used)
    return ports


def _components(edges, nodes):
    """One representative node per connected component of ``nodes`` over ``edges``."""
    adjacent = {}
    for x, y in edges:
        adjacent.setdefault(x, []).append(y)
        adjacent.setdefault(y, []).append(x)
    seen, reps = set(), []
    for n in sorted(nodes):
        if n in seen:
            continue
        reps.append(n)
        seen.add(n)
        frontier = [n]
        while frontier:
            frontier = [y for x in frontier for y in adjacent.get(x, ()) if y not in seen]
            seen.update(frontier)
    return reps


def _flexible(atoms, candidates, ring_atoms):
    """The atoms whose aromatic pairing may still change: the candidates (current atom, branch stack)
    that have a free valence for a new neighbour or an exocyclic double bond, and every atom holding an
    open ring bond (its reserved bond may still become the ring double bond)."""
    out = set(ring_atoms)
    out.update(i for i in candidates if i is not None and atoms[i].used < atoms[i].kind.capacity)
    return out


def _can_reach_ring(atoms, edges, reach, rings, ringed):
    """Can every aromatic atom still end up on a ring?  New bonds can only start at 'ports': an open ring
    bond (one each) and a reachable atom (current, branch stack) with free valence (two if it has two
    free: it may open a ring bond and carry on).  An aromatic atom x on no cycle yet gets onto one only
    through two ports: two at x, one at x and one elsewhere, or two beyond different bonds of x (all
    of x's bonds are bridges).  Exact for 'no way at all'; it does not check that the ring would be
    aromatic."""
    loose = {x for x, a in enumerate(atoms) if a.kind.aromatic and x not in ringed}
    if not loose:
        return True
    ports = _ports(atoms, reach, rings)
    total = sum(ports.values())
    if total < 2:
        return False
    parts = Counter()                                  # per loose atom: its bonds with ports beyond them
    for (u, v), (child, side, whole) in _bridges(edges, ports).items():
        for end in (u, v):
            if end in loose and (whole - side if end == child else side):
                parts[end] += 1
    return all(ports[x] >= 2 or (ports[x] and total > ports[x]) or parts[x] >= 2 for x in loose)


def _match_all(need, avail, adjacent):
    """Backtracking perfect matching of every atom in ``need`` to a distinct neighbour in ``avail``."""
    if not need:
        return True
    a = min(need, key=lambda x: sum(1 for y in adjacent.get(x, ()) if y in avail))
    for b in adjacent.get(a, ()):
        if b in avail and b != a:
            if _match_all(need - {a, b}, avail - {a, b}, adjacent):
                return True
    return False


def _kekule_possible(atoms, edges, start, flexible):
    """Can the aromatic system containing atom ``start`` still be kekulized?  Every aromatic c without a
    double bond and every 2-connected aromatic n needs a ring double bond to a neighbour (a perfect
    matching on the aromatic bonds); atoms in ``flexible`` (the current atom, the branch stack, atoms
    with open ring bonds) may still change, so they may be matched or left out.  [nH], o and s take no
    ring double bond; other aromatic atoms (bracket charges, p, b) are treated as flexible.  Lenient:
    a True does not prove kekulization, a False does exclude it."""
    adjacent = {}
    for x, y in edges:
        if x is not None and atoms[x].kind.aromatic and atoms[y].kind.aromatic:
            adjacent.setdefault(x, set()).add(y)
            adjacent.setdefault(y, set()).add(x)
    component, frontier = {start}, [start]
    while frontier:
        frontier = [y for x in frontier for y in adjacent.get(x, ()) if y not in component]
        component.update(frontier)
    need, avail = set(), set()
    for i in component:
        kind, used, n_double, _, neighbours = atoms[i]
        if n_double:
            if kind.symbol == "n":                         # n=O: RDKit makes it [n+][O-], free for a ring bond
                avail.add(i)
            continue
        if kind.symbol == "c" or (kind.symbol == "n" and kind.capacity == 3 and neighbours == 2):
            (avail if i in flexible else need).add(i)
            avail.add(i)
        elif kind.symbol == "n" and kind.capacity == 3 and i in flexible:
            avail.add(i)
        elif kind.symbol not in ("o", "s", "se", "n") and used < kind.capacity:
            avail.add(i)                                   # bracket charges, p, b, *: lenient
    return _match_all(need, avail, adjacent)


_SYSTEMS_CACHE = {}


def _aromatic_systems_ok(atoms, edges, reach, rings):
    """Can every aromatic system still be kekulized?  ``_kekule_possible`` for each, over the bonds
    between aromatic atoms that are or may still become ring bonds, with the atoms that can still change
    (``_flexible``) left free.  Checked after every token, so a bond, branch or ring closure that
    freezes an atom or cuts off a future ring is caught where it happens."""
    aromatic = [i for i, a in enumerate(atoms) if a.kind.aromatic]
    if not aromatic:
        return True
    live = _ring_edges(edges, _ports(atoms, reach, rings))
    live = frozenset((x, y) for x, y in live if atoms[x].kind.aromatic and atoms[y].kind.aromatic)
    flexible = _flexible(atoms, reach, [i for _, (i, _) in rings]).intersection(aromatic)
    key = (live, tuple(atoms[i] for i in aromatic), frozenset(flexible))   # sibling states share it
    got = _SYSTEMS_CACHE.get(key)
    if got is None:
        if len(_SYSTEMS_CACHE) > 50_000:
            _SYSTEMS_CACHE.clear()
        got = _SYSTEMS_CACHE[key] = all(_kekule_possible(atoms, live, r, flexible)
                                        for r in _components(live, aromatic))
    return got


def _kekule_final(atoms, edges, strict=False):
    """The exact test for a finished molecule, as RDKit sanitizes it: every aromatic atom lies on a ring
    ('non-ring atom marked aromatic' otherwise), and the aromatic atoms that need a ring double bond (c
    without an exocyclic double bond, 2-connected n) can be paired along ring bonds between aromatic
    atoms (a bond between aromatic atoms that is on no ring is single, so it cannot take the double).
    ``strict`` (the lookahead's promise of a completion RDKit accepts): every aromatic atom lies on two ring
    bonds between aromatic atoms, as in an aromatic ring (RDKit refuses O=n1CC1, c1ccCC1 and
    NS(=c1)... closing onto an aromatic ring), and no aromatic n carries a double bond (n=O outside a
    six-ring: none in ESOL)."""
    ring = _ring_edges(edges)
    on_ring = {i for e in ring for i in e}
    if any(a.kind.aromatic and i not in on_ring for i, a in enumerate(atoms)):
        return False
    aromatic_ring = [(x, y) for x, y in ring if atoms[x].kind.aromatic and atoms[y].kind.aromatic]
    start = {i for e in aromatic_ring for i in e}
    if strict:
        degree = Counter(i for e in aromatic_ring for i in e)
        if any(a.kind.aromatic and (degree[i] < 2 or (a.kind.symbol == "n" and a.n_double))
               for i, a in enumerate(atoms)):
            return False
    if not aromatic_ring:
        return True
    return all(_kekule_possible(atoms, aromatic_ring, i, ()) for i in _components(aromatic_ring, start))


# ----- the state machine

class SmilesConstraint:
    """Incremental SMILES grammar + valence state machine for ``transformer.generate(constraint=...)``.

    ``constraint(tokens)``: the frozenset of ids allowed after ``tokens`` (the ids so far, <bos> first),
    empty after an invalid prefix; ``check(tokens)`` raises SmilesGrammarError instead.  Parse states are
    memoized by prefix, so a decoding step costs one transition.  The masks, each with its helper:

    * <pad>, <bos>, <unk>, non-SMILES tokens, ')' without a branch, '(' on a saturated atom: ``_steps``
    * a bond, ring bond or atom beyond a valence (B 3, C 4, N 3 and nitro N(=O)=O, O 2, P 5, S 6, halogens
      1; aromatic c 3 / n 3 / o 2 / s 2, ring bonds counting 1; bracket atoms by H count and charge):
      ``_bond_cost``, with the capacities of ``_atom_kind``
    * '-', '/', '\\' between aromatic atoms, '=' at an aromatic atom other than c=O and c=S:
      ``_add_atom`` (``_aromatic_double_ok``), ``_ring_open``, ``_ring_close``
    * a ring closure onto the same atom or a bonded pair, or with conflicting orders: ``_ring_close``
    * a bond that nothing may follow: ``_allowed``
    * open rings, or aromatic atoms short of neighbours, that no reachable atom can serve: ``_alive``
    * a token after which an aromatic atom can no longer end up on a ring: ``_can_reach_ring``
    * aromatic systems that can no longer be kekulized: ``_aromatic_ring_ok`` (small rings, at a closure),
      ``_aromatic_systems_ok`` (lenient pairing, every token), ``_kekule_final`` (exact, at '.' and <eos>)
    * '.' or <eos> with a branch or ring open, after a bond or '(', before any atom, or (<eos>) with an
      aromatic atom short of neighbours: ``_allowed``, ``_can_end``
    * with ``max_new_tokens``, a token after which the molecule cannot end within the budget:
      ``_allowed_at`` (``_min_to_finish``, a cautious count; ``_finishable``, a bounded search once fewer
      than ``SLACK`` spare tokens are left)
    * with ``max_ring_size``, a ring closure making a ring of more atoms (``_ring_close``, ``_ring_size_ok``),
      and a token after which an open ring could no longer be closed within that size (``_rings_closable``);
      a '(' is then kept only if something may follow it, as a bond is (``_allowed``)
    * with ``lookahead=True``: a ring label right after '(' and a bond ("C(=1", which RDKit refuses; ``_steps``),
      a nitro-like N with two =O and no third bond, at '.' and <eos>, or out of reach (``_final_ok``,
      ``_alive``); and a token after which a bounded search finds no completion: ``_completion``, a
      depth-first search for a way to <eos> through the allowed sets (over the common atoms ``SEARCH_ATOMS``,
      ring labels, ')', '=' and '#'), every step passing the masks above; it keeps the token only when the
      search finds a completion within ``LOOKAHEAD_NODES`` states and ``LOOKAHEAD_ROOM`` tokens, or the tokens
      the budget leaves when fewer, and masks it otherwise (``__call__`` runs it on every candidate;
      ``generate`` asks ``candidates`` and ``confirm``, and runs it only on the ids a draw may pick,
      ``transformer._pick_confirmed``: the same distribution).  This catches the dead ends the cheap masks
      see only tokens later (an aromatic opener left without an aromatic partner, a
      ring that can no longer close within ``max_ring_size``); the price is the other way round: a token whose
      completions need other atoms, a '(' or more states is masked too (``python tools/completability.py
      --refused-only`` counts the training molecules with a prefix it refuses)

    Not seen without ``lookahead``: a dead end that shows only tokens later (generate's ``backtrack`` undoes
    those), and rarer molecules RDKit cannot kekulize (an aromatic n=O passes, as nitro-like input); with it,
    only what its final checks miss (none in the completability tests).

    The budget for sampling: ``max_new_tokens=SmilesConstraint.length_budget(train_token_lists)``
    (the training molecules' 99th-percentile token count, <eos> included, + ``LENGTH_MARGIN``, and never
    below the longest training molecule's count) instead of generate's cap: a sample the model cannot close
    is forced shut near that length, not at the cap; with ``max_ring_size`` (the training molecules' largest
    ring) a forced closure cannot make a macrocycle.
    Per-sample counters, for ``generate(..., constraint=c, backtrack=n)`` in one process::

        c.begin(); new, reason = generate(...); stats = c.sample_stats()
        # {"undos": tokens generate undid (a call whose prefix is not longer than the previous one's),
        #  "forced_closures": answers (one per decoding step; a step revisited after an undo counts again)
        #  where the budget removed a token the grammar allows: the sample was being steered shut (with
        #  ``lookahead``: the prefixes where it refused an id that ``confirm`` checked and whose search
        #  finds a completion within LOOKAHEAD_ROOM tokens, the budget aside, each counted once),
        #  "forced": forced_closures > 0, the sample's ending was forced by the budget (also ``last_forced``)}
    """

    LENGTH_QUANTILE = 0.99  # length_budget: this quantile of the training token counts (<eos> included) ...
    LENGTH_MARGIN = 5       # ... plus this many tokens

    @classmethod
    def length_budget(cls, token_lists, quantile=None, margin=None):
        """A ``max_new_tokens`` tied to the training lengths: the nearest-rank ``quantile`` (default
        ``LENGTH_QUANTILE``) of ``len(tokens) + 1`` (<eos>) over ``token_lists``, plus ``margin`` (default
        ``LENGTH_MARGIN``), but never below ``max(len(tokens)) + 1``: a budget under the longest training
        molecule forces samples shut that the training data would let run on (in experiment 4, a budget of 60 against
        97 tokens force-closed 17 % of samples).  ValueError on an empty list or a quantile outside (0, 1]."""
        quantile = cls.LENGTH_QUANTILE if quantile is None else quantile
        margin = cls.LENGTH_MARGIN if margin is None else margin
        lengths = sorted(len(t) + 1 for t in token_lists)
        if not lengths or not 0 < quantile <= 1:
            raise ValueError(f"length_budget: need training molecules and 0 < quantile <= 1, got "
                             f"{len(lengths)} molecules and quantile {quantile!r}")
        return max(lengths[max(0, math.ceil(quantile * len(lengths)) - 1)] + margin, lengths[-1])

    SLACK = 8              # with max_new_tokens: search for a way to <eos> once fewer spare tokens are left
    SEARCH_NODES = 300     # states that search may expand before it trusts the estimate

    CLOSE_SLACK = 2        # close_on_eos: tokens allowed beyond the cautious estimate of what closing needs

    LOOKAHEAD_NODES = 30   # lookahead: states one search may enter; a token whose search finds no way is masked
    LOOKAHEAD_ROOM = 60    # lookahead: the longest completion (tokens, <eos> included) it looks for
    CERTIFICATE_SLACK = 12  # lookahead: the plain completion's tokens beyond _min_to_finish (rings to fill)
    SEARCH_ATOMS = ("C", "c", "N", "n", "O", "o", "[nH]")   # lookahead: the atoms a completion may add

    def __init__(self, vocab, max_new_tokens=None, max_cache=200_000, max_ring_size=None, close_on_eos=False,
                 lookahead=False):
        """``max_ring_size``: None (no limit) or the largest ring, in atoms, a ring closure may make (>= 3).
        ``close_on_eos``: when the model's own choice is <eos> where a molecule cannot end yet (a ring or a
        branch is open), the molecule is closed from there: ``generate`` reports the refused choice
        (``refused``) and from then on only what finishes within about ``_min_to_finish`` + CLOSE_SLACK
        tokens is allowed, the model choosing among the closings.  Without it such a sample goes on with the
        model's <eos> masked, and often wanders until the budget forces it shut.
        ``lookahead``: keep a token only if a bounded search finds a completion after it (``_completion``)."""
        if max_ring_size is not None and (isinstance(max_ring_size, bool) or not isinstance(max_ring_size, int)
                                          or max_ring_size < 3):
            raise ValueError(f"SmilesConstraint: max_ring_size must be None or an int >= 3 (the smallest ring), "
                             f"got {max_ring_size!r}")
        if not isinstance(lookahead, bool):
            raise ValueError(f"SmilesConstraint: lookahead must be True or False, got {lookahead!r}")
        self.vocab = vocab
        self.lookahead = lookahead
        self.max_new_tokens = max_new_tokens
        self.max_ring_size = max_ring_size
        self._last_len, self.undos, self.forced = 0, 0, 0     # per-sample counters (begin / sample_stats)
        self._forced_now = set()   # lookahead: the prefixes where the budget refused an id confirm checked
        self.bos_id, self.eos_id = vocab.bos_id, vocab.eos_id
        self.classes = [("special",) if t in vocab.SPECIALS else _token_class(t) for t in vocab.itos]
        self.atom_ids = [i for i, c in enumerate(self.classes) if c[0] == "atom"]
        self.bond_ids = [i for i, c in enumerate(self.classes) if c[0] == "bond"]
        self.bond_set = frozenset(self.bond_ids)
        self._grow = any(c[0] == "atom" and c[1].symbol == "C" for c in self.classes)   # chains for _rings_closable
        self._look = self.bond_set if max_ring_size is None else self.bond_set | {   # kept only if something may
            i for i, c in enumerate(self.classes) if c[0] == "open"}                 # follow (_allowed)
        self.ring_ids = [i for i, c in enumerate(self.classes) if c[0] == "ring"]
        self.stoi_ring = {self.classes[i][1]: i for i in self.ring_ids}
        self.open_ids = [i for i, c in enumerate(self.classes) if c[0] == "open"]
        self.close_ids = [i for i, c in enumerate(self.classes) if c[0] == "close"]
        self.dot_ids = [i for i, c in enumerate(self.classes) if c[0] == "dot"]
        self.o_ids = {i for i in self.atom_ids if self.classes[i][1].symbol in ("O", "o")}
        self._search_atom_ids = [i for i in self.atom_ids if vocab.itos[i] in self.SEARCH_ATOMS]
        self._search_bond_ids = [i for i in self.bond_ids if vocab.itos[i] in ("=", "#")]
        self._plain_atoms = {a: [vocab.stoi[t] for t in (("c", "C") if a else ("C",)) if t in vocab.stoi]
                             for a in (False, True)}          # _certificate: the atoms it adds, in this order
        self.max_cache = max_cache
        self._memo = {}            # prefix -> _State
        self._allowed_memo = {}    # prefix -> (ids allowed after it, whether they still pass _looks_ahead)
        self._forced_keys = set()  # prefixes after which the budget removed a token the grammar allows
        self._closing_memo = {}    # close_on_eos: (prefix, closing budget) -> (ids, pending), as above
        self._root = _State()
        self._closing = None       # close_on_eos: (prefix length at the refused <eos>, its budget) or None
        self._confirm_memo = {}    # lookahead: (prefix, id) -> whether its search found a completion
        if close_on_eos:
            self.refused = self._refused    # generate's hook (transformer._choose) exists only when asked for
        if lookahead:
            self.confirm = self._confirm    # generate's lazy hook: asked only about the ids it may draw

    # ----- public API
    def __call__(self, tokens):
        """Allowed next ids after ``tokens`` (all ids so far, starting with <bos>)."""
        ids = self.candidates(tokens)
        return frozenset(t for t in ids if self._confirm(tokens, t)) if self.lookahead else ids

    def candidates(self, tokens):
        """The ids that may follow ``tokens``: with ``lookahead``, a superset of ``__call__``'s answer whose
        ids still pass ``confirm`` (their searches run only on the ids ``generate`` is about to draw,
        ``transformer._choose``); without it, the same answer.  The per-sample counters count here."""
        key = tuple(tokens)
        if len(key) <= self._last_len:
            self.undos += 1                   # generate(backtrack=) asks again after undoing a token
        self._last_len = len(key)
        state = self._state(key)
        if state is None:
            return frozenset()
        if self._closing is not None and len(key) < self._closing[0]:
            self._closing = None              # backtracking undid the refused <eos>'s position
        ids = self._answer(key, state)[0]
        if self._closing is None and key in self._forced_keys:
            self.forced += 1
        return ids

    def _answer(self, key, state):
        """(ids, room) after the prefix ``key``: closing at the model's request within the closing budget,
        else the plain answer; ``room``: None, or the tokens within which each id's ``_looks_ahead`` search has to
        find a completion."""
        if self._closing is None:
            return self._allowed_after(key, state)
        got = self._closing_memo.get((key, self._closing[1]))
        if got is None:
            got = self._closing_memo[key, self._closing[1]] = self._allowed_at(key, state, self._closing[1])[::2]
        return got

    def _confirm(self, tokens, tid):
        """``lookahead``: True if ``tid`` may follow ``tokens``, one of ``candidates``' ids whose search finds a
        completion (``generate``'s hook: ``transformer._choose`` asks only about the ids it may draw)."""
        key = tuple(tokens)
        state = self._state(key)
        if state is None:
            return False
        ids, room = self._answer(key, state)
        if tid not in ids:
            return False
        if room is None or self._looks_ahead(key, state, tid, room):
            return True
        if (self._closing is None and room < self.LOOKAHEAD_ROOM and key not in self._forced_now
                and self._looks_ahead(key, state, tid, self.LOOKAHEAD_ROOM)):
            self._forced_now.add(key)         # the budget refused an id that has a completion without it
            self.forced += 1
        return False

    def _looks_ahead(self, key, st, tid, room):
        """``lookahead``'s test of one token, memoized by (prefix, id, room): <eos> and '.' pass (``_allowed``
        ran their final checks); any other id only if ``_completion`` finds a way to <eos> after it within
        ``room`` tokens."""
        got = self._confirm_memo.get((key, tid, room))
        if got is None:
            got = self._confirm_memo[key, tid, room] = bool(
                tid == self.eos_id or tid in self.dot_ids
                or self._completion(self._advance(st, tid), room, [self.LOOKAHEAD_NODES]))
        return got

    def _refused(self, tokens, token_id):
        """``generate`` drew ``token_id`` after ``tokens`` and this constraint does not allow it: a refused
        <eos> starts closing the molecule (close_on_eos), with a budget of the tokens used, the cautious
        estimate of what closing needs and CLOSE_SLACK (with ``lookahead``, at least the completion its search
        finds)."""
        if token_id != self.eos_id or self._closing is not None:
            return
        state = self._state(tuple(tokens))
        if state is not None:
            need = self._min_to_finish(state) + self.CLOSE_SLACK
            if self.lookahead:                # at least the completion the search finds (the prefix has one)
                left = (self.max_new_tokens or len(tokens) + self.LOOKAHEAD_ROOM) - len(tokens) + 1
                need = max(need, self._completion(state, left, [self.LOOKAHEAD_NODES]))
            self._closing = (len(tokens), len(tokens) - 1 + need)

    def begin(self):
        """Reset the per-sample counters: call before each ``generate``."""
        self._last_len, self.undos, self.forced, self._closing = 0, 0, 0, None
        self._forced_now = set()

    @property
    def last_forced(self):
        """True if, since ``begin``, the budget restricted an answer: the sample's ending was forced."""
        return self.forced > 0

    def sample_stats(self):
        """The counters since ``begin``: {"undos": ..., "forced_closures": ..., "forced": ``last_forced``,
        "closed_on_eos": whether the molecule was closed because the model chose <eos> (close_on_eos)}."""
        return {"undos": self.undos, "forced_closures": self.forced, "forced": self.last_forced,
                "closed_on_eos": self._closing is not None}

    def check(self, tokens):
        """Raise SmilesGrammarError at the first id of ``tokens`` (starting with <bos>) that is not allowed."""
        tokens = list(tokens)
        if not tokens or tokens[0] != self.bos_id:
            raise SmilesGrammarError(tokens or ["<empty>"], 0, "a sequence starts with <bos>")
        for t in range(1, len(tokens)):
            if tokens[t] not in self(tokens[:t]):
                names = [self.vocab.itos[i] if 0 <= i < len(self.vocab) else i for i in tokens]
                raise SmilesGrammarError(names, t, self._why(tokens[:t], tokens[t]))
        return True

    def completion(self, tokens):
        """With ``lookahead``: the ids of the completion its search finds after ``tokens`` (starting with <bos>),
        <eos> last, within the budget when there is one; None if the prefix is refused or none is found.  Every
        token this constraint allows has one (``_allowed``): what the completability tests check with RDKit."""
        st = self._state(tuple(tokens))
        if st is None:
            return None
        room = self.LOOKAHEAD_ROOM if self.max_new_tokens is None else self.max_new_tokens - len(tokens) + 1
        path = []
        return path if self._completion(st, room, [self.LOOKAHEAD_NODES], path) else None

    def accepts(self, tokens):
        """True if every id of ``tokens`` (starting with <bos>) is allowed after the ones before it."""
        try:
            return self.check(tokens)
        except SmilesGrammarError:
            return False

    # ----- prefix -> state
    def _state(self, key):
        """The parse state after the prefix ``key`` (a tuple of ids), or None if the prefix is not allowed."""
        state = self._memo.get(key)
        if state is not None:
            return state
        if not key or key[0] != self.bos_id:
            return None
        if len(key) == 1:
            return self._root
        parent_key = key[:-1]
        parent = self._state(parent_key)
        if parent is None:
            return None
        ids, room = self._allowed_after(parent_key, parent)
        if key[-1] not in ids or room is not None and not self._looks_ahead(parent_key, parent, key[-1], room):
            return None
        state = self._advance(parent, key[-1])
        if len(self._memo) >= self.max_cache:
            self._memo.clear()
            self._allowed_memo.clear()
            self._forced_keys.clear()
            self._closing_memo.clear()
            self._confirm_memo.clear()
        self._memo[key] = state
        return state

    def _allowed_after(self, key, state):
        """(allowed ids, room) after the prefix ``key`` whose parse state is ``state``, memoized by prefix
        (``room``: None, or the search room ``_looks_ahead`` confirms each id within)."""
        got = self._allowed_memo.get(key)
        if got is None:
            ids, forced, room = self._allowed_at(key, state)
            got = self._allowed_memo[key] = (ids, room)
            if forced:
                self._forced_keys.add(key)
        return got

    # ----- transitions
    def _advance(self, st, tid):
        """The state after token ``tid``, or None if it breaks a valence or an aromatic rule."""
        cls = self.classes[tid]
        kind = cls[0]
        if st.owed and kind not in ("ring", "bond"):
            return None                       # a too-large ring closed here waits for its fused partner
        if kind == "atom":
            return self._add_atom(st, cls[1])
        if kind == "bond":
            return st._replace(prev="bond", pending=cls[1])
        if kind == "open":
            return st._replace(prev="open", pending=None, stack=st.stack + (st.cur,))
        if kind == "close":
            return st._replace(prev="close", cur=st.stack[-1], pending=None, stack=st.stack[:-1])
        if kind == "ring":
            return self._ring(st, cls[1])
        if kind == "dot":
            return st._replace(prev="start", cur=None, pending=None, stack=())
        return st._replace(prev="end", pending=None)                  # <eos>

    @staticmethod
    def _add_atom(st, kind):
        """State after an atom of ``kind`` bonded to the current atom by the pending bond (single if none),
        or None if that bond exceeds a valence, is '-', '/' or '\\' between aromatic atoms, or is a '='
        that ``_aromatic_double_ok`` refuses."""
        prev, cur, pending, stack, rings, atoms, edges, needy, ringed, _ = st  # locals: the hottest transition
        new = _Atom(kind)
        if cur is None:                                               # the first atom of a molecule
            atoms = atoms + (new,)
        else:
            here = atoms[cur]
            if pending == 1 and kind.aromatic and here.kind.aromatic:
                return None                   # '/', '\' or '-' between aromatic atoms: never an aromatic bond
            if pending == 2 and not _aromatic_double_ok(here.kind, kind):
                return None
            if pending == 2 and kind.symbol == "S" and here.kind.aromatic:
                new = _Atom(replace(kind, capacity=2))       # c=S is a thione: the S takes no further bond
            order = pending or 1
            got = _bond_cost(here, order, kind.symbol in ("O", "o"))
            if got is None:
                return None
            mine = _bond_cost(new, order, here.kind.symbol in ("O", "o"))
            if mine is None:
                return None
            atoms = list(atoms)
            atoms[cur] = _Atom(here.kind, *got, here.neighbours + 1)
            atoms.append(_Atom(new.kind, *mine, 1))
            atoms = tuple(atoms)
            edges = edges | {(cur, len(atoms) - 1)}
        idx = len(atoms) - 1
        return _State(prev="atom", cur=idx, pending=None, stack=stack, rings=rings, atoms=atoms, edges=edges,
                      needy=_update_needy(needy, (cur, idx), atoms, rings), ringed=ringed)

    def _ring(self, st, label):
        """State after ring label ``label``: it opens a ring bond, or closes the one open under that label."""
        rings = dict(st.rings)
        if label not in rings:
            return self._ring_open(st, label, rings)
        return self._ring_close(st, label, rings, self.max_ring_size, fused=self.lookahead)

    @staticmethod
    def _ring_open(st, label, rings):
        """Open ring bond ``label`` on the current atom, reserving its bond (the pending order, single if
        none); None if the atom cannot take it."""
        cur = st.atoms[st.cur]
        if st.pending == 2 and cur.kind.aromatic:
            return None                   # it could never close (_aromatic_double_ok)
        got = _bond_cost(cur, st.pending or 1, False)
        if got is None:
            return None
        atoms = list(st.atoms)
        atoms[st.cur] = _Atom(cur.kind, *got, cur.neighbours)        # no neighbour until it closes
        atoms = tuple(atoms)
        rings[label] = (st.cur, st.pending)
        rings = tuple(sorted(rings.items()))
        return _State(prev="ring", cur=st.cur, pending=None, stack=st.stack, rings=rings, atoms=atoms,
                      edges=st.edges, needy=_update_needy(st.needy, (st.cur,), atoms, rings), ringed=st.ringed,
                      owed=st.owed)

    @staticmethod
    def _ring_close(st, label, rings, max_ring_size=None, fused=False):
        """Close ring bond ``label`` (open in ``rings``, a dict) between the atom that opened it and the
        current atom; None onto the same atom or a bonded pair, with conflicting orders, an explicit single
        or double ring bond at an aromatic atom, an exceeded valence, a ring ``_aromatic_ring_ok`` refuses,
        or a ring of more than ``max_ring_size`` atoms (``_ring_size_ok``) unless (``fused``: with lookahead) the
        other ring bonds open may close here too and cut it short (``_chords``): then the state is ``owed`` them
        until the smallest rings are all small (c1cccc2ccccc1, then 2: ``_rings_too_large``)."""
        other, opened = rings.pop(label)
        if other == st.cur or (other, st.cur) in st.edges or (st.cur, other) in st.edges:
            return None
        large = max_ring_size is not None and not _ring_size_ok(st.edges, other, st.cur, max_ring_size)
        if large and not (fused and _ring_size_ok(st.edges | _chords(st, rings.values(), other), other, st.cur,
                                                  max_ring_size)):
            return None
        if opened is not None and st.pending is not None and opened != st.pending:
            return None
        order = st.pending or opened or 1
        far, cur = st.atoms[other], st.atoms[st.cur]
        if 1 in (st.pending, opened) and far.kind.aromatic and cur.kind.aromatic:
            return None                       # an explicit single ring bond between aromatic atoms
        if order == 2 and (far.kind.aromatic or cur.kind.aromatic):
            return None                       # a ring bond cannot be the exocyclic c=O of _aromatic_double_ok
        if opened is None and order != 1:     # upgrade the single bond reserved at the opening
            got = _bond_cost(far._replace(used=far.used - 1), order, False)
        else:
            got = (far.used, far.n_double, far.n_double_o)
        if got is None:
            return None
        mine = _bond_cost(cur, order, False)
        if mine is None:
            return None
        if far.kind.aromatic and cur.kind.aromatic:   # other ring bonds still open may close right here: count them
            maybe = st.edges | {(i, st.cur) for i, _ in rings.values()}
            if not (_aromatic_ring_ok(st.atoms, st.edges, other, st.cur, bool(rings)) or
                    _aromatic_ring_ok(st.atoms, maybe, other, st.cur, bool(rings))):
                return None
        atoms = list(st.atoms)
        atoms[other] = _Atom(far.kind, *got, far.neighbours + 1)
        atoms[st.cur] = _Atom(cur.kind, *mine, cur.neighbours + 1)   # kekulizability: _alive checks every system
        rings = tuple(sorted(rings.items()))
        atoms = tuple(atoms)
        edges = st.edges | {(other, st.cur)}
        owed = (large or st.owed) and _rings_too_large(edges, max_ring_size)
        return _State(prev="ring", cur=st.cur, pending=None, stack=st.stack, rings=rings, atoms=atoms,
                      edges=edges, needy=_update_needy(st.needy, (other, st.cur), atoms, rings),
                      ringed=frozenset(i for e in _ring_edges(edges) for i in e), owed=owed)

    # ----- what may come next
    @staticmethod
    def _min_to_finish(st):
        """A cautious estimate of the tokens still needed to end after ``st``: one ')' per open branch, a
        label and a closing atom per open ring (rings opened on the same atom need distinct closers), an
        atom after a bond or '(' (or at the start), one per aromatic atom short of neighbours, two (a label
        opened and closed) when no ring is open but an aromatic atom is on none yet, and <eos>.  Cautious
        on purpose: a tight estimate left more molecules unable to end within the budget."""
        prev, _, _, stack, rings, atoms, _, needy, ringed, _ = st
        loose = not rings and any(a.kind.aromatic and i not in ringed for i, a in enumerate(atoms))
        return len(stack) + 2 * len(rings) + (prev in ("bond", "open", "start")) + len(needy) + 2 * loose + 1

    def _allowed_at(self, key, st, budget=None):
        """(allowed ids, forced, room) after the prefix ``key`` (<bos> included); with ``max_new_tokens`` a
        token is kept only if the molecule can still be finished (closed and ended with <eos>) within
        the budget of new tokens (``budget`` when given, closing at the model's request, never above
        ``max_new_tokens``); ``forced``: the budget removed a token the grammar allows.  With ``lookahead``
        the ids are ``_allowed``'s candidates, each still to pass ``_looks_ahead`` within ``room`` tokens:
        ``LOOKAHEAD_ROOM``, or the tokens the budget leaves when fewer (the search replaces ``_finishable``);
        ``_confirm`` then counts a prefix as forced where the budget refuses an id the search at
        ``LOOKAHEAD_ROOM`` keeps.  Without it ``room`` is None: no search."""
        grammar = allowed = self._allowed(st)
        n_tokens = len(key)
        cap = self.max_new_tokens if budget is None else min(budget, self.max_new_tokens or budget)
        room = None if cap is None or st is self._root else cap - n_tokens   # new tokens left after this one
        if self.lookahead:
            return frozenset(grammar), False, self.LOOKAHEAD_ROOM if room is None else min(room, self.LOOKAHEAD_ROOM)
        if room is not None:
            if room + 1 - self._min_to_finish(st) < self.SLACK and not self._finishable(st, room + 1):
                return frozenset(), bool(grammar), None  # no way to <eos> in the budget: backtrack= undoes it
            allowed = [t for t in grammar if t == self.eos_id or self._min_to_finish(self._advance(st, t)) <= room]
        return frozenset(allowed), len(allowed) < len(grammar), None

    def _finishable(self, st, room, nodes=None, memo=None):
        """True if a continuation of at most ``room`` tokens (<eos> included) leads from ``st`` to <eos>
        through the allowed sets, each state on it within ``_min_to_finish`` of the budget: a depth-first
        search, lowest estimate first, memoized by parse state within this one search (``memo`` keeps the
        largest room known too small and the smallest known enough).  A "yes" is a real path.  A "no" is
        cautious like the estimate: a path squeezing in under it is not taken (closing early left more
        molecules valid).  After ``SEARCH_NODES`` expanded states without an answer it trusts the estimate.
        The memo lives for one top-level call: a memo kept across calls would let answers from earlier
        samples stretch the node budget, so a prefix's answer would depend on what was sampled before it
        (and on how samples are split between workers)."""
        if nodes is None:
            nodes, memo = [self.SEARCH_NODES], {}
        if self._min_to_finish(st) > room:
            return False
        key = (st.prev, st.cur, st.pending, st.stack, st.rings, st.atoms, st.edges)
        too_small, enough = memo.get(key, (-1, None))
        if room <= too_small:
            return False
        if enough is not None and room >= enough:
            return True
        if nodes[0] <= 0:
            return True                       # search budget spent: the estimate's answer (room >= need)
        nodes[0] -= 1
        found = self._can_end(st) and self._final_ok(st)
        if not found:
            for need, _, nxt, check in sorted((self._min_to_finish(nxt), tid, nxt, check)
                                              for tid, nxt, check in self._steps(st)):
                if need > room - 1:
                    break
                if (not check or self._alive(nxt)) and self._finishable(nxt, room - 1, nodes, memo):
                    found = True
                    break
        if nodes[0] > 0:                      # an answer from a search cut short is not memoized
            too_small, enough = memo.get(key, (-1, None))
            memo[key] = ((too_small, min(room, enough or room)) if found else (max(room, too_small), enough))
        return found

    def _steps(self, st, search=False):
        """(id, state, needs _alive) for every token but '.' and <eos> that the grammar and the valences allow
        after ``st``, before the costly checks: ``_allowed`` runs them on every state (and keeps a bond
        only if something may follow it), the budget search only on the states it enters.  ``search``: only
        the tokens the lookahead's completions use (``SEARCH_ATOMS``, '=', '#', ring labels, ')')."""
        prev = st.prev
        if prev == "end":
            return []
        out = [(tid, self._advance(st, tid), True) for tid in (self._search_atom_ids if search else self.atom_ids)]
        if prev != "start":
            after_atom = prev in ("atom", "ring", "close")
            cur_atom = st.atoms[st.cur]
            if after_atom or prev == "open":
                out += [(tid, self._advance(st, tid), False) for tid in
                        (self._search_bond_ids if search else self.bond_ids)
                        if _bond_cost(cur_atom, self.classes[tid][1], True) is not None]
            if prev in ("atom", "ring", "bond", "close") and not (
                    self.lookahead and prev == "bond" and st.stack and st.stack[-1] == st.cur):   # "(=1": no SMILES
                out += [(tid, self._ring(st, self.classes[tid][1]), True) for tid in self.ring_ids]
            if after_atom and self._free(cur_atom) and not search:
                out += [(tid, self._advance(st, tid), False) for tid in self.open_ids]
            if after_atom and st.stack:
                out += [(tid, self._advance(st, tid), True) for tid in self.close_ids]
        return [x for x in out if x[1] is not None]

    def _alive(self, st):
        """The molecule can still be completed: every aromatic atom short of neighbours is the current atom
        or on the branch stack with a free valence, open rings have a reachable atom with a free valence,
        every aromatic atom can still end up on a ring (``_can_reach_ring``), every aromatic system can
        still be kekulized (``_aromatic_systems_ok``), and (with ``lookahead``) a nitro-like N short of its third
        bond is reachable."""
        _, cur, _, stack, rings, atoms, edges, needy, ringed, owed = st
        if owed and _rings_too_large(edges | {(i, cur) for _, (i, _) in rings}, self.max_ring_size):
            return False                      # no ring bond still open can make the rings at cur small
        reach = (cur,) + stack if cur is not None else stack
        for a in needy:
            if a not in reach or not self._free(atoms[a]):
                return False
        if self.lookahead and any(a.kind.nitro and 3 < a.used < 5 and i not in reach for i, a in enumerate(atoms)):
            return False                      # N(=O)=O short of its third bond, and nothing can reach it
        if rings and not any(self._free(atoms[a]) for a in reach):
            return False
        if rings and self.max_ring_size is not None and not self._rings_closable(st, reach):
            return False
        return _can_reach_ring(atoms, edges, reach, rings, ringed) and _aromatic_systems_ok(atoms, edges, reach, rings)

    def _rings_closable(self, st, reach):
        """Every open ring can still close within ``max_ring_size`` atoms, by a plan ``_close_plan`` finds.
        A ring closed at atom x has dist(a, x) + 1 atoms (a its opening atom, ``_ring_size_ok``); every later
        current atom is a reachable atom r (current atom, branch stack) or grows from one, one bond farther
        than its parent, so a ring is closable only near some r.  Distances only shrink as bonds are added.
        The plan closes each ring at an r (2 <= dist(a, r) <= max_ring_size - 1, its order of r's free
        valence) or on a chain of new C atoms grown from r (one valence of r), at depth k with
        2 <= dist(a, r) + k <= max_ring_size - 1 and k <= 3, up to 2 bond orders per chain atom (C: 4 =
        parent + child + 2); with ``lookahead`` a ring too long for that still fits where another open ring,
        its opening atom near enough to a, may close at the same atom and cut it (fused rings, c1cccc2ccccc12;
        optimistic, so only where the search confirms each token: ``owed`` holds the closure to it).  Taking
        the plan's first step (a closure, the first chain atom, a ')') leaves a state whose rest of the plan
        fits the same model.  Not modelled: the aromatic rules (an aromatic opening atom
        needs an aromatic partner to kekulize), so a dead end can remain there (generate's backtrack)."""
        limit = self.max_ring_size - 1
        free = {r: st.atoms[r].kind.capacity - st.atoms[r].used for r in set(reach) if r is not None}
        options = []                                  # per ring: (order, [(resource, r), ...])
        for _, (a, opened) in st.rings:
            dist = _distances(st.edges, a)
            cuts = [_distances(st.edges, b) for _, (b, _) in st.rings       # fused: another ring b closing at
                    if self.lookahead and b != a and dist.get(b) is not None and dist[b] + 1 <= limit]   # the
            #                                                                   same atom cuts the ring

            def fits(d, r, k):                        # a ring closed at r (k = 0) or k atoms on: small enough
                return d + k <= limit or any(db.get(r) is not None and db[r] + k <= limit for db in cuts)
            opts = []
            for r in free:
                d = dist.get(r)
                if d is None:
                    continue
                if d >= 2 and fits(d, r, 0):
                    opts.append(("direct", r))        # close at r: ring of d + 1 atoms (or cut by a fused one)
                if self._grow:                        # close on a chain of new atoms at depth k: d + k + 1 atoms
                    opts.extend((k, r) for k in range(max(1, 2 - d), 4) if fits(d, r, k))
            if not opts:
                return False
            options.append((opened or 1, opts))
        options.sort(key=lambda o: len(o[1]))
        left = {("direct", r): f for r, f in free.items()}
        left.update({(k, r): 2 for r in free for k in (1, 2, 3)})   # depths beyond 3: never needed to decide
        return _close_plan(options, 0, left, set())

    @staticmethod
    def _free(atom):
        """The _Atom can take one more bond."""
        return atom.used < atom.kind.capacity

    def _can_end(self, st):
        return st.prev in ("atom", "ring", "close") and not st.stack and not st.rings and not st.needy and not st.owed

    def _final_ok(self, st):
        """The frozen molecule passes the exact tests: ``_kekule_final``, and (with ``lookahead``, which promises
        a completion RDKit accepts) no nitro-like N holds two =O without its third bond (N(=O)=O alone has
        valence 4, which RDKit refuses; without lookahead such a sample fails as in the committed runs)."""
        if self.lookahead and any(a.kind.nitro and 3 < a.used < 5 for a in st.atoms):
            return False
        return _kekule_final(st.atoms, st.edges, strict=self.lookahead)

    def _allowed(self, st):
        """The allowed ids after ``st`` without the budget: ``_steps`` that pass ``_alive`` (a bond needs an
        atom or ring bond after it), with ``lookahead`` every step, each still to pass ``_looks_ahead`` (a
        search for a way to <eos>); then '.' and <eos> where ``_final_ok`` passes the frozen molecule."""
        if self.lookahead:
            out = [tid for tid, _, _ in self._steps(st)]      # candidates: each still to pass _looks_ahead
        else:
            out = [tid for tid, nxt, check in self._steps(st)
                   if (self._alive(nxt) if check else tid not in self._look or self._allowed(nxt))]
        if st.prev in ("atom", "ring", "close"):
            final = None                   # '.' and <eos> freeze every atom so far: the exact test
            if not st.stack and not st.rings and not st.owed:
                final = self._final_ok(st)
                if final:
                    out.extend(self.dot_ids)
            if self._can_end(st):
                if final is None:
                    final = self._final_ok(st)
                if final:
                    out.append(self.eos_id)
        return out

    def _rank(self, tid, nxt, aromatic):
        """The search's order of the steps (``nxt`` the state after ``tid``): after an aromatic atom, aromatic
        atoms first (a ring grows around, c1ccc: the estimate would favour leaving it, c1ccC), then the lowest
        estimate; after any other atom the lowest estimate first (a branch closes, n(C)c), then atoms like the
        current one."""
        need, unlike = self._min_to_finish(nxt), self._unlike(tid, aromatic)
        return (unlike, need) if aromatic else (need, unlike)

    def _unlike(self, tid, aromatic):
        """1 for an atom token whose aromaticity differs from ``aromatic``, else 0 (the search's tie-break)."""
        cls = self.classes[tid]
        return int(cls[0] == "atom" and cls[1].aromatic != aromatic)

    def _certificate(self, st, room, path=None, five=False):
        """The plain completion, tried before any search, one rule a step: close the ring opened last at the
        current atom if both are alike (aromatic or not; an aromatic ring at six atoms or more) and ``_advance``
        allows it, else open a ring at a lone aromatic atom (one the ring opened last cannot close an aromatic
        ring on, ``_joined``), else close a branch (not where that ring may close on the current atom: it
        closes inside the branch, c1ccc(cc1); an aromatic ring only on such a ``_joined`` path), else
        add an atom: after a bond or '(' a C (a substituent), with a ring open one like its opening atom.  It
        ends when <eos> passes ``_can_end`` and ``_final_ok``.  Returns the room the path needs (the largest
        ``_min_to_finish`` + steps so far along it, so a search with that room would take it too), or 0 if it
        does not end within ``room`` or ``CERTIFICATE_SLACK`` tokens of the estimate.  ``path``: a list the
        path's ids (<eos> last) go into.  ``five``: an aromatic ring holding a heteroatom closes at five atoms
        (pyrrole, imidazolone), the second try."""
        needs, ids = 0, []
        for depth in range(min(room, self._min_to_finish(st) + self.CERTIFICATE_SLACK)):
            needs = max(needs, self._min_to_finish(st) + depth)
            if needs > room:
                return 0
            if self._can_end(st) and self._final_ok(st):
                if path is not None:
                    path.extend(ids + [self.eos_id])
                return needs
            step, last = None, max(st.rings, key=lambda r: r[1][0]) if st.rings else None   # (label, (atom, order))
            like = last is not None and st.atoms[last[1][0]].kind.aromatic
            if st.prev in ("atom", "ring", "close"):
                joined = self._joined(st, last)
                if (last is not None and st.atoms[st.cur].kind.aromatic == like and last[0] in self.stoi_ring
                        and (not like or joined and self._ring_long_enough(st, last[1][0], five))):
                    x = self._ring(st, last[0])
                    step = None if x is None else (self.stoi_ring[last[0]], x)
                if step is None and st.cur in st.needy and not joined:
                    free = next((t for t in self.ring_ids if self.classes[t][1] not in dict(st.rings)), None)
                    x = None if free is None else self._ring(st, self.classes[free][1])
                    step = None if x is None else (free, x)      # a lone aromatic atom opens a ring
                if step is None and st.stack and not joined:
                    x = self._advance(st, self.close_ids[0])
                    step = None if x is None else (self.close_ids[0], x)
            if step is None and (last is not None or st.prev in ("bond", "open")):
                atoms = self._plain_atoms[like and st.prev not in ("bond", "open")]
                step = next(((tid, x) for tid in atoms if (x := self._advance(st, tid)) is not None), None)
            if step is None:
                return 0
            ids.append(step[0])
            st = step[1]
        return 0

    def _completion(self, st, room, nodes, path=None):
        """The lookahead's search: a way from ``st`` to <eos> in at most ``room`` tokens (<eos> included)
        through ``_steps(search=True)``, each state on it passing ``_alive`` (``_search``).  Returns the
        smallest room the path it found fits in, or 0 if it found none within ``nodes[0]`` states (spent as it
        goes).  Nothing is remembered, within a call or across calls: a token's answer is a function of its
        prefix alone (the same in any order, on any worker).  The next state of a found path usually finds
        the rest of it again; where it does not, ``generate`` meets a dead end and backtracks (``backtrack``).
        ``path``: a list the path's ids go into (``completion``)."""
        return self._search(st, room, nodes, path)

    @staticmethod
    def _joined(st, last):
        """``_certificate``: the ring opened last may close on the current atom into an aromatic ring (its
        opening atom aromatic and every atom between them too); if not, a lone aromatic atom opens its own."""
        if last is None or not st.atoms[last[1][0]].kind.aromatic or not st.atoms[st.cur].kind.aromatic:
            return False
        return all(st.atoms[i].kind.aromatic for i in _shortest_path(st.edges, last[1][0], st.cur) or ())

    @staticmethod
    def _ring_long_enough(st, opener, five):
        """``_certificate``'s aromatic ring closes here: six atoms or more, or five holding a heteroatom."""
        dist = _distances(st.edges, opener).get(st.cur, 0)
        if dist >= 5 or not five or dist < 4:
            return dist >= 5
        return any(st.atoms[i].kind.symbol != "c" for i in _shortest_path(st.edges, opener, st.cur))

    def _search(self, st, room, nodes, path=None):
        """``_completion``'s depth-first search: ``_certificate`` at every state, then the steps in ``_rank``'s
        order, every state within ``_min_to_finish`` of the room."""
        need = self._min_to_finish(st)
        if need > room or nodes[0] <= 0:
            return 0
        nodes[0] -= 1
        found = self._certificate(st, room, path)     # the plain way first: close what is open
        if not found and st.rings and any(a.kind.aromatic and a.kind.symbol != "c" for a in st.atoms):
            found = self._certificate(st, room, path, five=True)   # an aromatic heteroatom may make a five-ring
        if not found:
            arom = st.cur is not None and st.atoms[st.cur].kind.aromatic     # grow like the current atom first
            ranked = sorted((self._rank(tid, nxt, arom), tid, nxt, check)
                            for tid, nxt, check in self._steps(st, search=True))
            for rank, tid, nxt, check in ranked:
                if nodes[0] <= 0:
                    break                             # out of states: no child is tried
                if rank[arom] > room - 1:
                    continue                          # beyond the room (rank: (unlike, need) after an aromatic atom)
                if check and not self._alive(nxt):
                    continue
                got = self._search(nxt, room - 1, nodes, path)
                if got:
                    found = max(need, got + 1)        # the room this path needs from here
                    if path is not None:
                        path.insert(0, tid)
                    break
        return found

    def _why(self, prefix, tid):
        """A short reason why ``tid`` is not allowed after ``prefix`` (for error messages)."""
        st = self._state(tuple(prefix))
        if st is None:
            return "the prefix itself is invalid"
        cls = self.classes[tid] if 0 <= tid < len(self.classes) else ("other",)
        if tid == self.eos_id:
            if st.stack:
                return "<eos> while a branch is open"
            if st.rings:
                return f"<eos> while ring bond(s) {[r for r, _ in st.rings]} are open"
            if st.prev in ("atom", "ring", "close") and not st.needy and not _kekule_final(st.atoms, st.edges):
                return "<eos> here: an aromatic atom is on no ring, or the aromatic rings cannot be kekulized"
            return "<eos> here would leave an incomplete molecule (after a bond, '(' or a lone aromatic atom)"
        if cls[0] in ("special", "other"):
            return "not a SMILES token"
        if self.lookahead and tid in self._allowed(st):
            return (f"{cls[0]} token after which the lookahead's search finds no completion (within "
                    f"{self.LOOKAHEAD_NODES} states, {self.LOOKAHEAD_ROOM} tokens and the budget)")
        if cls[0] == "close" and not st.stack:
            return "')' without an open branch"
        return f"{cls[0]} token after a '{st.prev}' token would break the grammar or exceed a valence"


# =====================================================================================
# 2. Why RDKit rejects a string, and SELFIES (experiment 4)
# =====================================================================================

# Why RDKit rejects a string: the categories of the tutorial's failure analysis.
FAILURE_REASONS = ("unk", "unbalanced_branch", "unclosed_ring", "valence", "kekulization", "other")


def _ring_labels_balanced(tokens):
    counts = Counter(t for t in tokens if _token_class(t)[0] == "ring")
    return all(n % 2 == 0 for n in counts.values())


def smiles_failure_reason(smiles):
    """None if RDKit parses ``smiles``, else one of FAILURE_REASONS:

    'unk' (the string holds <unk>), 'unbalanced_branch' (parentheses do not pair), 'unclosed_ring'
    (a ring-bond label occurs an odd number of times), 'valence' (RDKit's AtomValenceException),
    'kekulization' (KekulizeException / AtomKekulizeException, including 'non-ring atom marked
    aromatic'), 'other' (empty string, untokenizable text, duplicate ring bond, ...).  Needs RDKit.
    """
    Chem = import_rdkit()
    if "<unk>" in smiles:
        return "unk"
    if not smiles:
        return "other"
    try:
        tokens = tokenize_smiles(smiles)
    except ValueError:
        return "other"
    depth = 0
    for t in tokens:
        depth += (t == "(") - (t == ")")
        if depth < 0:
            return "unbalanced_branch"
    if depth:
        return "unbalanced_branch"
    if not _ring_labels_balanced(tokens):
        return "unclosed_ring"
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles, sanitize=False)
        if mol is None or mol.GetNumAtoms() == 0:
            return "other"
        problems = [p.GetType() for p in Chem.DetectChemistryProblems(mol)]
        if not problems and Chem.MolFromSmiles(smiles) is not None:
            return None
    if "AtomValenceException" in problems:
        return "valence"
    if any("Kekulize" in p for p in problems):
        return "kekulization"
    return "other"


# SELFIES (the tutorial's remedy); chemdata.tokenize_selfies splits a SELFIES string into its bracketed symbols.
def _import_selfies():
    try:
        import selfies
    except ImportError as e:
        raise ImportError(f"SELFIES needs the selfies package: {CHEM_EXTRA_HINT}") from e
    return selfies


def smiles_to_selfies(smiles):
    """SELFIES string of a SMILES, encoded from RDKit's canonical SMILES (so a nitro N(=O)=O arrives as
    [N+](=O)[O-], which SELFIES' valence rules accept); ValueError naming the SMILES if RDKit cannot
    parse it or selfies cannot encode it."""
    sf = _import_selfies()
    canonical = canonical_smiles(smiles, require_rdkit=True)
    if canonical is None:
        raise ValueError(f"selfies cannot encode SMILES {smiles!r}: RDKit cannot parse it")
    try:
        return sf.encoder(canonical, strict=True)
    except sf.EncoderError as e:
        raise ValueError(f"selfies cannot encode SMILES {smiles!r}: {e}") from None


def selfies_to_smiles(selfies_string):
    """SMILES decoded from a SELFIES string (every SELFIES string decodes; '' for an empty one)."""
    sf = _import_selfies()
    try:
        return sf.decoder(selfies_string)
    except sf.DecoderError as e:
        raise ValueError(f"selfies cannot decode {selfies_string!r}: {e}") from None


# =====================================================================================
# 3. The partner of each closing token: ring digit, ')' (experiment 5)
# =====================================================================================

def closing_partners(tokens):
    """For each token of a tokenised SMILES (no special tokens), its partner if it closes something:
    ('ring', j) when token i is the ring label that closes the ring opened by the same label at token j,
    ('branch', j) when token i is the ')' of the '(' at token j; None otherwise.  A ring label that is
    seen again after closing opens a new ring ('C1CC1C1CC1').  Raises SmilesGrammarError (with the
    tokens and the position) on a ')' with no open '(' and on a ring or branch still open at the end."""
    out, opens, stack = [None] * len(tokens), {}, []
    for i, tok in enumerate(tokens):
        cls = _token_class(tok)[0]
        if cls == "ring":
            if tok in opens:
                out[i] = ("ring", opens.pop(tok))
            else:
                opens[tok] = i
        elif cls == "open":
            stack.append(i)
        elif cls == "close":
            if not stack:
                raise SmilesGrammarError(tokens, i, "')' with no open '('")
            out[i] = ("branch", stack.pop())
    left = sorted(list(opens.values()) + stack)
    if left:
        raise SmilesGrammarError(tokens, left[0], "ring or branch never closed")
    return out
