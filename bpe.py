"""Byte-pair encoding (BPE) for SMILES strings and for words. Standard library only.

BPE starts from single symbols (the characters of a SMILES string, or atom tokens you
split yourself) and repeatedly glues the adjacent pair that saves the most tokens into
a new symbol: ``c`` + ``c`` -> ``cc``, then ``cc`` + ``c`` -> ``ccc``, ... After
training, ``encode`` cuts a new string into the learned pieces and ``decode`` glues
them back.

Corpus and items
    * a string: split into characters, e.g. ``"CCO"`` -> ``C C O``;
    * a list/tuple of strings: pre-split tokens, e.g. ``["Cl", "c", "1", "c", "c"]``.
      A token is never split, only glued to its neighbours.
    With ``end_of_word=False`` (SMILES) each item is one "word". With
    ``end_of_word=True`` (natural language, Sennrich et al. 2016) a string is split on
    whitespace into words and the marker ``</w>`` is appended to the symbols of every
    word, so a suffix such as ``est</w>`` differs from ``est`` inside a word; a token
    list is then one word. ``decode`` turns each ``</w>`` back into a single space, so
    runs of whitespace come back as one space. Text may not contain ``</w>`` itself.

Training rules (all deterministic, independent of corpus order)
    * Identical words are counted once with their frequency.
    * The *gain* of a pair is the measured drop in token count if it were merged left
      to right, non-overlapping, in every word. It equals the pair frequency except for
      repeats: ``c c c`` holds the pair (c, c) twice but merging gives ``cc c``, one
      token fewer, so the gain is 1.
    * Each step merges the pair with the largest gain; ties go to the lexicographically
      smallest pair ``(a, b)`` (plain Python string order).
    * ``criterion="count"`` instead ranks pairs by their raw occurrence count (overlapping
      occurrences included, ``c c c`` counts (c, c) twice) and never skips a pair: the
      classic rule of Sennrich et al. and of the tutorial's appendix E.  The merge itself is
      the same (left to right, non-overlapping); ``merge_log`` still records the measured
      gain, so the gain ledger below holds for both rules, and ``merge_counts`` the counts.
      A merge may then recreate an existing symbol (``c`` + ``cc`` when ``ccc`` exists), so
      ``vocab`` (distinct symbols) can be shorter than initial symbols + merges.
    * Training stops early when the best gain is below ``min_pair_freq`` (or no pair
      is left); ``stopped_early`` is then True and ``len(merges) < num_merges``.
    * (gain rule) A pair whose glued string already is a symbol (e.g. ``c`` + ``cc`` after ``cc`` +
      ``c`` made ``ccc``, or ``C`` + ``l`` when ``Cl`` is a pre-split token) is skipped
      and listed in ``skipped_pairs``. Hence every merge adds exactly one new symbol,
      ``len(vocab) == len(initial_symbols) + len(merges)``, and the rank-greedy
      ``encode`` below gives exactly the segmentation of replaying training.

Encoding
    Within each word, repeatedly take the adjacent pair with the lowest merge rank and
    merge all its left-to-right occurrences (the GPT-2 / Sennrich encoder). Symbols
    never seen in training stay single-symbol tokens; ``unknown_symbols`` counts them
    and ``encode_ids`` refuses them (there is no ``<unk>`` id).
"""
import heapq

END_OF_WORD = "</w>"


def _merge_word(word, a, b, merged):
    """Merge every left-to-right, non-overlapping occurrence of (a, b) in ``word``."""
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _pair_counts(word):
    """{pair: raw number of occurrences in ``word``}; ``c c c`` gives {(c, c): 2}."""
    counts = {}
    for p in zip(word, word[1:]):
        counts[p] = counts.get(p, 0) + 1
    return counts


CRITERIA = ("gain", "count")


def _pair_gains(word):
    """{pair: tokens saved by merging it in ``word``}; ``c c c`` gives {(c, c): 1}."""
    gains, last = {}, {}
    for i in range(len(word) - 1):
        p = (word[i], word[i + 1])
        if last.get(p) == i - 1:  # overlaps the occurrence just counted (a == b)
            continue
        last[p] = i
        gains[p] = gains.get(p, 0) + 1
    return gains


def _check_train_args(num_merges, min_pair_freq, criterion):
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if int(num_merges) != num_merges or num_merges < 0:
        raise ValueError(f"num_merges must be an integer >= 0, got {num_merges!r}")
    if int(min_pair_freq) != min_pair_freq or min_pair_freq < 1:
        raise ValueError(f"min_pair_freq must be an integer >= 1, got {min_pair_freq!r}")


class _PairTable:
    """The training state of ``BPE.train``: the distinct words (merged in place) with their
    frequencies, each word's pair statistics (``stat_of``: gains or counts), the corpus totals
    ``stats`` (pair -> sum of statistic * frequency), ``where`` (pair -> indices of words holding it)
    and a max-heap on the totals (ties -> smallest pair) whose stale entries are dropped when popped."""

    def __init__(self, words, freqs, stat_of):
        self.words, self.freqs, self.stat_of = words, freqs, stat_of
        self.stats, self.where = {}, {}
        self.word_stats = [stat_of(w) for w in words]         # per word: pair -> gain (or count)
        for i, (g, f) in enumerate(zip(self.word_stats, freqs)):
            for p, c in g.items():
                self.stats[p] = self.stats.get(p, 0) + c * f
                self.where.setdefault(p, set()).add(i)
        self.heap = [(-g, p) for p, g in self.stats.items()]
        heapq.heapify(self.heap)

    def pop(self):
        """(pair, total) with the largest current total, or (None, 0) when the heap is empty."""
        heap, stats = self.heap, self.stats
        while heap:
            neg, p = heapq.heappop(heap)
            if stats.get(p, 0) == -neg:
                return p, -neg
        return None, 0

    def merge(self, pair, merged):
        """Merge ``pair`` into ``merged`` in every word holding it and update the totals, ``where``
        and the heap; returns the tokens saved on the corpus (frequencies included)."""
        (a, b), words, freqs, word_stats = pair, self.words, self.freqs, self.word_stats
        stats, where = self.stats, self.where
        changed, saved = set(), 0
        for i in where.pop(pair):
            if pair not in word_stats[i]:  # stale index
                continue
            new = _merge_word(words[i], a, b, merged)
            new_stats, f = self.stat_of(new), freqs[i]
            saved += (len(words[i]) - len(new)) * f
            for p, c in word_stats[i].items():
                stats[p] -= c * f
                changed.add(p)
            for p, c in new_stats.items():
                stats[p] = stats.get(p, 0) + c * f
                where.setdefault(p, set()).add(i)
                changed.add(p)
            words[i], word_stats[i] = new, new_stats
        for p in changed:
            if stats[p] > 0:
                heapq.heappush(self.heap, (-stats[p], p))
            else:
                del stats[p]
        return saved


class BPE:
    """Byte-pair encoder (the tutorial's appendix E). Typical use::

        bpe = BPE().train(smiles_list, num_merges=500)
        tokens = bpe.encode("c1ccccc1O")      # e.g. ['c1cccc', 'c1', 'O']
        assert bpe.decode(tokens) == "c1ccccc1O"

    Attributes after ``train``: ``merge_log`` (list of ``(pair, merged, gain)``),
    ``merges`` (pairs in rank order), ``initial_symbols`` (sorted), ``vocab`` (initial
    symbols, then merged symbols in rank order), ``token_to_id``, ``stopped_early``,
    ``n_merges_done``, ``skipped_pairs``, ``n_initial_tokens`` / ``n_final_tokens``
    (token counts of the training corpus before / after; their difference is the sum
    of the gains).
    """

    def __init__(self):
        self.end_of_word = False
        self.criterion = "gain"
        self.merge_counts = []
        self.min_pair_freq = 2
        self.num_merges_requested = 0
        self.initial_symbols = []
        self.merge_log = []
        self.skipped_pairs = []
        self.stopped_early = False
        self.n_initial_tokens = self.n_final_tokens = 0
        self.unknown_symbols = 0
        self._rebuild()

    # ---------------------------------------------------------------- properties
    @property
    def merges(self):
        return [pair for pair, _, _ in self.merge_log]

    @property
    def n_merges_done(self):
        return len(self.merge_log)

    def _rebuild(self):
        # distinct symbols in order of first appearance (a count-rule merge can recreate one)
        self.vocab = list(dict.fromkeys(list(self.initial_symbols) + [m for _, m, _ in self.merge_log]))
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.ranks = {pair: r for r, (pair, _, _) in enumerate(self.merge_log)}
        self._cache = {}

    # ---------------------------------------------------------------- splitting
    def _words(self, item):
        """Item -> list of words, each a tuple of initial symbols (``</w>`` appended)."""
        if isinstance(item, str):
            if not self.end_of_word:
                return [tuple(item)] if item else []
            if END_OF_WORD in item:
                raise ValueError(f"text may not contain {END_OF_WORD!r}: {item!r}")
            return [tuple(w) + (END_OF_WORD,) for w in item.split()]
        if isinstance(item, (list, tuple)):
            if not all(isinstance(t, str) and t for t in item):
                raise TypeError(f"pre-split tokens must be non-empty strings: {item!r}")
            if not item:
                return []
            return [tuple(item) + ((END_OF_WORD,) if self.end_of_word else ())]
        raise TypeError(f"an item must be a string or a list of token strings, got {type(item).__name__}")

    # ---------------------------------------------------------------- training
    def train(self, corpus, num_merges, min_pair_freq=2, end_of_word=False, criterion="gain"):
        """Learn up to ``num_merges`` merges from ``corpus`` (list of items); returns self.
        ``criterion``: "gain" (default: measured tokens saved, skip pairs that recreate a symbol)
        or "count" (raw pair count, no skipping; the tutorial's rule)."""
        _check_train_args(num_merges, min_pair_freq, criterion)
        self.__init__()
        self.end_of_word, self.min_pair_freq = bool(end_of_word), int(min_pair_freq)
        self.num_merges_requested = int(num_merges)
        self.criterion = criterion

        words, freqs = self._count_words(corpus)
        self.initial_symbols = sorted({s for w in words for s in w})
        self.n_initial_tokens = sum(len(w) * f for w, f in zip(words, freqs))
        table = _PairTable(words, freqs, _pair_gains if criterion == "gain" else _pair_counts)
        symbols, skipped = set(self.initial_symbols), set()

        while len(self.merge_log) < num_merges:
            best, gain = self._best_pair(table, symbols, skipped)
            if best is None or gain < self.min_pair_freq:
                self.stopped_early = True
                break
            merged = best[0] + best[1]
            saved = table.merge(best, merged)
            symbols.add(merged)
            self.merge_log.append((best, merged, saved))     # saved == gain under the gain rule
            self.merge_counts.append(gain)

        self.n_final_tokens = sum(len(w) * f for w, f in zip(words, freqs))
        self._rebuild()
        return self

    def _count_words(self, corpus):
        """(distinct words, their frequencies) in order of first appearance: identical words are
        processed once."""
        freq_of = {}  # word -> count
        for item in corpus:
            for w in self._words(item):
                freq_of[w] = freq_of.get(w, 0) + 1
        return list(freq_of), list(freq_of.values())

    def _best_pair(self, table, symbols, skipped):
        """(pair, statistic) of the next merge, or (None, 0) when no pair is left.  Under the gain
        rule a pair whose glued string already is a symbol is skipped for good (``skipped_pairs``)."""
        while True:
            p, stat = table.pop()
            if p is None:
                return None, 0
            if p in skipped:
                continue
            if self.criterion == "gain" and p[0] + p[1] in symbols:
                skipped.add(p)
                self.skipped_pairs.append(p)
                continue
            return p, stat

    # ---------------------------------------------------------------- encoding
    def _encode_word(self, word):
        if word in self._cache:
            return self._cache[word]
        out, ranks = word, self.ranks
        while len(out) > 1:
            pair = min(zip(out, out[1:]), key=lambda p: ranks.get(p, float("inf")))
            if pair not in ranks:
                break
            out = _merge_word(out, pair[0], pair[1], pair[0] + pair[1])
        self._cache[word] = out
        return out

    def encode(self, item):
        """Item (string or token list) -> list of token strings."""
        tokens = []
        for w in self._words(item):
            self.unknown_symbols += sum(s not in self.token_to_id for s in w)
            tokens.extend(self._encode_word(w))
        return tokens

    def replay(self, item):
        """The training segmentation of ``item``: every merge of ``merge_log`` applied in training
        order, each left to right and non-overlapping.  ``encode`` (rank-greedy) gives the same."""
        tokens = []
        for w in self._words(item):
            for (a, b), merged, _ in self.merge_log:
                if a in w:
                    w = _merge_word(w, a, b, merged)
            tokens.extend(w)
        return tokens

    def encode_ids(self, item):
        """Item -> list of vocabulary ids; raises KeyError on a symbol unseen in training."""
        tokens = self.encode(item)
        try:
            return [self.token_to_id[t] for t in tokens]
        except KeyError as e:
            raise KeyError(f"symbol {e.args[0]!r} was not seen in training (no <unk> id)") from None

    def decode(self, tokens):
        """Token strings -> text. With end_of_word, each ``</w>`` becomes one space."""
        text = "".join(tokens)
        if self.end_of_word:
            text = text.replace(END_OF_WORD, " ").rstrip(" ")
        return text

    def decode_ids(self, ids):
        return self.decode([self.vocab[i] for i in ids])

    # ---------------------------------------------------------------- persistence
    def to_json(self):
        """A JSON-serialisable dict holding everything needed to encode and decode."""
        return {
            "format": "bpe-v1",
            "end_of_word": self.end_of_word,
            "criterion": self.criterion,
            "merge_counts": list(self.merge_counts),
            "min_pair_freq": self.min_pair_freq,
            "num_merges_requested": self.num_merges_requested,
            "stopped_early": self.stopped_early,
            "n_initial_tokens": self.n_initial_tokens,
            "n_final_tokens": self.n_final_tokens,
            "initial_symbols": list(self.initial_symbols),
            "merge_log": [[list(p), m, g] for p, m, g in self.merge_log],
            "skipped_pairs": [list(p) for p in self.skipped_pairs],
        }

    @classmethod
    def from_json(cls, d):
        if d.get("format") != "bpe-v1":
            raise ValueError(f"not a bpe-v1 dict: format={d.get('format')!r}")
        bpe = cls()
        for k in ("end_of_word", "min_pair_freq", "num_merges_requested", "stopped_early",
                  "n_initial_tokens", "n_final_tokens", "initial_symbols"):
            setattr(bpe, k, d[k])
        bpe.merge_log = [(tuple(p), m, g) for p, m, g in d["merge_log"]]
        bpe.criterion = d.get("criterion", "gain")
        bpe.merge_counts = list(d.get("merge_counts", [g for _, _, g in bpe.merge_log]))
        bpe.skipped_pairs = [tuple(p) for p in d["skipped_pairs"]]
        for (a, b), m, _ in bpe.merge_log:
            if a + b != m:
                raise ValueError(f"corrupt merge_log: {a!r} + {b!r} != {m!r}")
        bpe._rebuild()
        return bpe
