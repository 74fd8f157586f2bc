"""Tests for the inference side of transformer.py: the K/V-cached DecodeState against the plain forward
pass (and generate's cached loop against generate_plain, the plain loop), beam search against greedy decoding and \
exhaustive enumeration, the decoding-constraint hook,
parallel_map, and resumable (checkpointed) training.

    python tests/tests_generation.py         # zero third-party imports; one line per test
    python -m pytest tests/tests_generation.py

Every new inference path is checked against a path that was already trusted: cached logits against
``model.forward`` (itself pinned to PyTorch by tests/tests_parity_torch.py) at every step, beam search
against brute force, a resumed training run against an uninterrupted one, bit for bit.
"""
import collections
import contextlib
import functools
import io
import itertools
import math
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import transformer as core
from tests_transformer import _raises

SCHEMES = ("none", "sine", "learned", "rope")
V = 7


def _lm(pos, tie=True, max_len=32, seed=1):
    return core.TransformerLM(V, d_model=8, n_heads=2, n_layers=2, pos=pos, tie_weights=tie, max_len=max_len,
                            seed=seed)


def _s2s(pos, max_len=32, seed=2):
    return core.EncoderDecoder(V + 1, V, d_model=8, n_heads=2, n_layers=2, pos=pos, src_pad_id=V, max_len=max_len,
                             seed=seed)


def _max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- cached = plain, every step


def t_cached_lm_logits_equal_forward_at_every_step():
    rng = random.Random(0)
    for pos in SCHEMES:
        for tie in (True, False):
            model = _lm(pos, tie)
            seq = [rng.randrange(V) for _ in range(14)]
            state = core.start_decode(model, seq[:3])                   # a 3-token prefix in one pass
            for t in range(3, len(seq) + 1):
                plain = model.forward(seq[:t])[-1]
                assert _max_diff(state.logits, plain) <= 1e-12, (pos, tie, t)
                if t < len(seq):
                    state.step(seq[t])
            assert state.tokens == seq


def t_cached_prefix_rows_equal_forward_rows():
    rng = random.Random(1)
    for pos in SCHEMES:
        model = _lm(pos)
        seq = [rng.randrange(V) for _ in range(9)]
        rows = core.DecodeState(model).feed(seq)
        for r, p in zip(rows, model.forward(seq)):
            assert _max_diff(r, p) <= 1e-12, pos


def t_cached_encoder_decoder_logits_equal_forward_with_source_padding():
    rng = random.Random(2)
    for pos in SCHEMES:
        model = _s2s(pos)
        src = [rng.randrange(V) for _ in range(6)] + [V, V, V]      # three padded source positions
        tgt = [rng.randrange(V) for _ in range(10)]
        state = core.start_decode(model, tgt[:1], src=src)
        for t in range(1, len(tgt) + 1):
            plain = model.forward(src, tgt[:t])[-1]
            assert _max_diff(state.logits, plain) <= 1e-12, (pos, t)
            if t < len(tgt):
                state.step(tgt[t])


def t_learned_table_overflow_matches_plain_cropping():
    """Past max_len the plain path crops to the last max_len tokens; the cached path does the same."""
    model = _lm("learned", max_len=5)
    for greedy in (True, False):
        kw = dict(greedy=greedy, temperature=1.3, rng=7)
        cached = core.generate(model, [1, 2], 12, use_cache=True, **kw)
        plain = core.generate(model, [1, 2], 12, use_cache=False, **kw)
        assert cached == plain and len(cached) == 12
    seq = [random.Random(3).randrange(V) for _ in range(11)]
    state = core.start_decode(model, seq[:1])
    for t in range(2, len(seq) + 1):
        state.step(seq[t - 1])
        assert _max_diff(state.logits, model.forward(seq[:t][-5:])[-1]) <= 1e-12, t
    assert _raises(core.ShapeError, lambda: core.sequence_logprob(model, seq))


def t_head_mask_is_honoured_by_cached_decoding():
    """MultiHeadAttention.head_mask acts in every path: cached self-attention (extend) and cached
    cross-attention (attend_memory) give the logits of the training forward with the same mask."""
    rng = random.Random(4)
    lm, s2s = _lm("rope"), _s2s("sine")
    for b in lm.blocks:
        b.self_attn.head_mask = [1.0, 0.0]
    for b in s2s.dec_blocks:
        b.self_attn.head_mask, b.cross_attn.head_mask = [0.5, 1.0], [0.0, 1.0]
    seq = [rng.randrange(V) for _ in range(8)]
    src = [rng.randrange(V) for _ in range(5)] + [V]
    state, state2 = core.start_decode(lm, seq[:2]), core.start_decode(s2s, seq[:1], src=src)
    for t in range(2, len(seq)):
        assert _max_diff(state.logits, lm.forward(seq[:t])[-1]) <= 1e-12, t
        assert _max_diff(state2.logits, s2s.forward(src, seq[:t - 1])[-1]) <= 1e-12, t
        state.step(seq[t])
        state2.step(seq[t - 1])
    for b in lm.blocks:
        b.self_attn.head_mask = None
    assert _max_diff(core.start_decode(lm, seq).logits, state.logits) > 1e-6     # the mask did matter


def t_state_copy_branches_independently():
    model = _lm("rope")
    a = core.start_decode(model, [1, 2, 3])
    b = a.copy()
    la = a.step(4)
    lb = b.step(5)
    assert a.tokens == [1, 2, 3, 4] and b.tokens == [1, 2, 3, 5]
    assert _max_diff(la, model.forward([1, 2, 3, 4])[-1]) <= 1e-12
    assert _max_diff(lb, model.forward([1, 2, 3, 5])[-1]) <= 1e-12


def t_generate_plain_is_a_full_forward_per_token():
    """generate_plain with argmax is the loop written out here with model.forward: append the argmax of the
    last logits row, run the whole sequence again."""
    def argmax(row, allowed):
        return max(range(len(row)), key=row.__getitem__)
    for pos in SCHEMES:
        model = _lm(pos)
        ids = [0]
        for _ in range(8):
            row = model.forward(ids)[-1]
            ids.append(max(range(len(row)), key=row.__getitem__))
        assert core.generate_plain(model, [0], 8, argmax) == (ids[1:], "max_new_tokens"), pos
    assert "generate_plain" in str(_raises(ValueError, lambda: core.generate_plain(_lm("sine"), [], 3, argmax)))
    assert "src" in str(_raises(ValueError, lambda: core.generate_plain(_s2s("sine"), [0], 3, argmax)))


def t_cached_generation_equals_generate_plain():
    """generate's cached loop (DecodeState) chooses the tokens generate_plain chooses and stops for the same
    reason: greedy and seeded sampling, an eos id, a constraint; LM and EncoderDecoder, every position scheme."""
    reasons = set()
    for pos in SCHEMES:
        for model, src in ((_lm(pos), None), (_s2s(pos), [1, 2, 3, V])):
            for greedy, eos, constraint in ((True, None, None), (False, 2, None),
                                            (False, None, _only_odd_then_stuck)):
                rng = random.Random(7)
                def pick(row, allowed):
                    return core._pick(row, greedy, 1.3, None, rng, allowed)
                plain = core.generate_plain(model, [0], 10, pick, src=src, eos_id=eos, constraint=constraint)
                cached = core.generate(model, [0], 10, src=src, greedy=greedy, temperature=1.3, rng=7,
                                     eos_id=eos, constraint=constraint, return_reason=True)
                assert cached == plain, (pos, src, greedy, eos)
                reasons.add(plain[1])
    assert reasons == {"eos", "max_new_tokens", "no_allowed_token"}       # every stop was exercised


def t_sampling_same_seed_same_tokens_cached_or_not():
    for pos in SCHEMES:
        model = _lm(pos)
        for top_k in (None, 3):
            kw = dict(temperature=1.5, top_k=top_k, rng=11)
            assert (core.sample(model, [0], 15, use_cache=True, **kw)
                    == core.sample(model, [0], 15, use_cache=False, **kw))
        s2s = _s2s(pos)
        kw = dict(src=[1, 2, 3, V], temperature=1.2, rng=5)
        assert core.sample(s2s, [0], 10, use_cache=True, **kw) == core.sample(s2s, [0], 10, use_cache=False, **kw)


def t_decoding_leaves_a_pending_backward_intact():
    """Inference never writes the training caches: forward, decode, backward == forward, backward."""
    def grads(model, decode):
        model.zero_grad()
        logits = model.forward([1, 2, 3, 4])
        _, dl = core.cross_entropy_rows(logits, [2, 3, 4, 5])
        if decode:
            core.generate(model, [0, 1], 6, rng=1)
            core.beam_search(model, [0], 3, 4)
            core.sequence_logprob(model, [0, 3, 2, 1])
            core.parallel_map(lambda x, r: core.sample(model, [x], 3, rng=r), [1, 2], workers=1)
        model.backward(dl)
        return [list(r) for p in model.params() for r in p.rows("grad")]
    for pos in SCHEMES:
        assert grads(_lm(pos), False) == grads(_lm(pos), True), pos


def t_backward_differentiates_the_latest_forward():
    """A second training forward replaces the pending graph: dlogits of the first one no longer fit."""
    model = _lm("sine")
    _, dl_a = core.cross_entropy_rows(model.forward([1, 2, 3]), [2, 3, 4])
    model.forward([1, 2, 3, 4, 5])
    assert _raises(core.ShapeError, lambda: model.backward(dl_a))


# ----------------------------------------------------------------------------- scoring


def t_log_softmax_is_stable_and_normalised():
    """The log of eq. (2.3), max-subtracted: finite for logits of size 1e3, exp sums to 1, -inf stays -inf."""
    row = [1000.0, 999.0, -1000.0, 0.5]
    ls = core.log_softmax(row)
    assert abs(sum(math.exp(x) for x in ls) - 1.0) < 1e-12
    assert abs(ls[0] - ls[1] - 1.0) < 1e-12
    assert core.log_softmax([-math.inf, 0.0]) == [-math.inf, 0.0]


def t_sequence_logprob_equals_summed_cross_entropy():
    """Minus the summed cross-entropy of eq. (6.4): sequence_logprob through the cached pass equals -N times
    the mean loss of the teacher-forced forward."""
    for model, src in ((_lm("rope"), None), (_s2s("sine"), [3, 1, 4, V])):
        ids = [0, 3, 5, 1, 2]
        logits = model.forward(ids[:-1]) if src is None else model.forward(src, ids[:-1])
        loss, _ = core.cross_entropy_rows(logits, ids[1:])
        assert abs(core.sequence_logprob(model, ids, src=src) + loss * 4) < 1e-12


# ----------------------------------------------------------------------------- beam search


def t_beam_width_one_is_greedy():
    for pos in SCHEMES:
        model = _lm(pos, seed=3)
        for eos in (None, 2):
            best = core.beam_search(model, [0], 1, 12, eos_id=eos)
            assert len(best) == 1 and best[0].ids == core.greedy_decode(model, [0], 12, eos_id=eos), (pos, eos)
        s2s = _s2s(pos, seed=4)
        src = [1, 5, 2, V]
        assert core.beam_search(s2s, [0], 1, 10, src=src, eos_id=3)[0].ids == \
            core.greedy_decode(s2s, [0], 10, src=src, eos_id=3)


def _enumerate(model, prefix, vocab, horizon):
    """Every continuation of exactly ``horizon`` tokens with its log-probability, best first."""
    scored = [(core.sequence_logprob(model, prefix + list(c)), list(c))
              for c in itertools.product(range(vocab), repeat=horizon)]
    return sorted(scored, key=lambda x: (-x[0], x[1]))


def t_beam_search_matches_exhaustive_enumeration():
    """V = 5, horizon 3: a beam as wide as all 25 two-token prefixes is exact, and so is width k <= 5 over
    horizon 2 (every first token survives); every score is the summed log_softmax along the path."""
    model = core.TransformerLM(5, d_model=8, n_heads=2, n_layers=1, pos="sine", seed=9)
    truth3 = _enumerate(model, [0], 5, 3)
    beams = core.beam_search(model, [0], 25, 3, length_penalty=0.0)
    assert [b.ids for b in beams] == [ids for _, ids in truth3[:25]]
    for b, (lp, _) in zip(beams, truth3):
        assert abs(b.logprob - lp) < 1e-12 and b.score == b.logprob
    truth2 = _enumerate(model, [0], 5, 2)
    for k in (1, 2, 3, 5):
        beams = core.beam_search(model, [0], k, 2)
        assert [b.ids for b in beams] == [ids for _, ids in truth2[:k]], k
        for b in beams:
            assert abs(b.logprob - core.sequence_logprob(model, [0] + b.ids)) < 1e-12
            assert abs(b.score - b.logprob / 2) < 1e-15        # length_penalty 1: mean per token


def t_beam_search_finished_hypotheses_include_eos_and_are_deterministic():
    model = _lm("sine", seed=5)
    eos = 3
    beams = core.beam_search(model, [0], 4, 8, eos_id=eos, length_penalty=1.0)
    assert beams == core.beam_search(model, [0], 4, 8, eos_id=eos, length_penalty=1.0)
    for b in beams:
        assert eos not in b.ids
        full = [0] + b.ids + ([eos] if b.finished else [])
        assert abs(b.logprob - core.sequence_logprob(model, full)) < 1e-12
        n = len(b.ids) + b.finished
        assert abs(b.score - b.logprob / n) < 1e-15
    fin = [b.score for b in beams if b.finished]
    assert fin == sorted(fin, reverse=True)


# ----------------------------------------------------------------------------- constraints


def _only_odd_then_stuck(tokens):
    """Allows odd ids only, and nothing at all once 4 tokens have been produced after the prefix."""
    return [] if len(tokens) >= 5 else [1, 3, 5]


def t_constraint_is_honoured_by_sampling_greedy_and_beam():
    model = _lm("rope")
    for greedy in (True, False):
        ids, reason = core.generate(model, [0], 10, greedy=greedy, rng=3, constraint=_only_odd_then_stuck,
                                  return_reason=True)
        assert ids and all(i % 2 for i in ids) and len(ids) == 4 and reason == "no_allowed_token"
    for b in core.beam_search(model, [0], 3, 10, constraint=_only_odd_then_stuck):
        assert all(i % 2 for i in b.ids) and b.reason == "no_allowed_token" and len(b.ids) == 4
    # a constraint that allows everything changes nothing; None means "no restriction"
    assert core.sample(model, [0], 8, rng=2, constraint=lambda t: range(V)) == core.sample(model, [0], 8, rng=2)
    assert core.sample(model, [0], 8, rng=2, constraint=lambda t: None) == core.sample(model, [0], 8, rng=2)


def t_constraint_dead_end_in_a_batch_is_recorded_not_raised():
    model = _lm("sine")
    out = core.parallel_map(lambda n, r: core.generate(model, [0], 6, rng=r, return_reason=True,
                                                   constraint=(lambda t: [] if n == 1 else None)),
                          [0, 1, 2], workers=1)
    assert out[1] == ([], "no_allowed_token") and out[0][1] == out[2][1] == "max_new_tokens"


def t_truncate_equals_a_state_that_never_saw_the_later_tokens():
    rng = random.Random(4)
    cases = [(_lm(pos), None) for pos in SCHEMES] + [(_lm("learned", max_len=5), None), (_s2s("rope"), [1, 2, V])]
    for model, src in cases:
        seq = [rng.randrange(V) for _ in range(14)]
        plain = (lambda ids: model.forward(src, ids)[-1]) if src else \
            (lambda ids: model.forward(ids[-model.max_len:] if model.embed.pos == "learned" else ids)[-1])
        state = core.start_decode(model, seq[:11], src=src)
        twin = state.copy()
        for n in (9, 4, 1):
            logits = state.truncate(n)
            assert state.tokens == seq[:n] and _max_diff(logits, plain(seq[:n])) <= 1e-12, (n, src)
            for t in range(n, n + 3):                          # and it decodes on as a fresh state would
                state.step(seq[t])
                assert _max_diff(state.logits, plain(seq[:t + 1])) <= 1e-12, (n, t)
            state.truncate(n)
        assert twin.tokens == seq[:11] and _max_diff(twin.logits, plain(seq[:11])) <= 1e-12   # a copy: untouched
    assert _raises(ValueError, lambda: core.start_decode(_lm("sine"), [1, 2]).truncate(0))


def _no_three_then_eos(tokens):
    """A trap the constraint cannot see coming: after a 3 nothing is allowed; <eos> (6) from length 6."""
    if tokens[-1] == 3:
        return []
    return [1, 2, 3, 6] if len(tokens) >= 6 else [1, 2, 3]


def t_backtracking_escapes_dead_ends_same_with_and_without_cache():
    for model in [_lm(pos) for pos in SCHEMES] + [_lm("learned", max_len=4)]:
        for seed in range(6):
            kw = dict(temperature=1.5, rng=seed, eos_id=6, constraint=_no_three_then_eos, backtrack=40,
                      return_reason=True)
            cached = core.generate(model, [0], 12, use_cache=True, **kw)
            assert cached == core.generate(model, [0], 12, use_cache=False, **kw)
            ids, reason = cached
            assert 3 not in ids[:-1] and reason in ("eos", "max_new_tokens") and len(ids) >= 5, cached


def t_greedy_backtracking_is_a_depth_first_search_in_logit_order():
    """Greedy with backtracking = the first dead-end-free path of a depth-first search that tries the
    allowed ids best logit first, written out here with model.forward."""
    def dfs(model, ids, left):
        if left == 0:
            return []
        allowed = _no_three_then_eos(ids)
        logits = model.forward(ids)[-1]
        for i in sorted(allowed, key=lambda j: (-logits[j], j)):
            if i == 6:
                return []
            rest = dfs(model, ids + [i], left - 1)
            if rest is not None:
                return [i] + rest
        return None
    for pos in SCHEMES:
        model = _lm(pos, seed=5)
        got = core.greedy_decode(model, [0], 8, eos_id=6, constraint=_no_three_then_eos, backtrack=100)
        assert got == dfs(model, [0], 8), pos


def t_backtracking_budget_is_honoured():
    model = _lm("rope")
    kw = dict(greedy=True, constraint=_only_odd_then_stuck, return_reason=True)
    assert len(core.generate(model, [0], 10, **kw)[0]) == 4
    ids, reason = core.generate(model, [0], 10, backtrack=2, **kw)     # two undos: the third odd id at position 4
    assert reason == "no_allowed_token" and len(ids) == 4
    logits = model.forward([0] + ids[:3])[-1]
    assert ids[3] == min((1, 3, 5), key=lambda i: logits[i])       # the best two were tried and undone
    ids3, reason3 = core.generate(model, [0], 10, backtrack=3, **kw)   # position 4 exhausted: stops at 3 tokens
    assert reason3 == "no_allowed_token" and len(ids3) == 3 and ids3 == ids[:3]


def t_backtracking_helper_on_a_hand_made_distribution():
    """_generate_backtracking alone, with a fixed logits table instead of a model: greedy tries the ids
    best logit first, undoes a dead end, rules the undone id out at its position and backs up further
    when a position has nothing left; the row of a position is asked for once per new visit."""
    table = {0: [0.0, 3.0, 2.0, 1.0], 1: [0.0, 1.0, 3.0, 2.0], 2: [0.0, 1.0, 3.0, 2.0], 3: [0.0, 2.0, 1.0, 3.0]}
    calls = []

    def logits_after(ids):                         # the row depends on the last id only
        calls.append(tuple(ids))
        return table[ids[-1]]

    def traps(tokens):                             # dead ends after [0, 1, 2] and [0, 1, 3, 3]
        return [] if tokens[1:] in ([1, 2], [1, 3, 3]) else [1, 2, 3]
    def pick(row, allowed):
        return max(allowed, key=row.__getitem__)
    run = core._generate_backtracking
    # 1, 2 -> dead end, undo 2; 3 (the next best after 1), 3 -> dead end, undo 3; 1, 2
    assert run(logits_after, [0], 4, pick, None, traps, 5) == ([1, 3, 1, 2], "max_new_tokens")
    assert calls == [(0,), (0, 1), (0, 1, 2), (0, 1, 3), (0, 1, 3, 3), (0, 1, 3, 1)]
    assert run(logits_after, [0], 4, pick, None, traps, 1) == ([1, 3, 3], "no_allowed_token")   # undo spent
    assert run(logits_after, [0], 4, pick, 3, traps, 1) == ([1], "eos")      # 3 is eos after the undo

    def after_one_nothing_works(tokens):
        if tokens[1:] == [1]:
            return [2, 3]
        return [] if tokens[1:] in ([1, 2], [1, 3]) else [1, 2, 3]
    calls.clear()
    # 1, 2 dead, 1, 3 dead: position 2 has nothing left, so back up to position 1 and rule 1 out there
    assert run(logits_after, [0], 4, pick, None, after_one_nothing_works, 5) == ([2, 2, 2, 2], "max_new_tokens")
    assert calls == [(0,), (0, 1), (0, 1, 2), (0, 1, 3), (0, 2), (0, 2, 2), (0, 2, 2, 2)]


# ----------------------------------------------------------------------------- parallel_map


def t_parallel_map_output_does_not_depend_on_worker_count():
    model = _lm("sine")

    def draw(temperature, rng):                  # a closure over a model built in this function
        return core.sample(model, [0], 6, temperature=temperature, rng=rng)
    items = [0.7, 1.0, 1.3] * 4
    one = core.parallel_map(draw, items, workers=1, seed=4)
    two = core.parallel_map(draw, items, workers=2, seed=4)
    assert one == two and len(set(map(tuple, one))) > 1
    assert core.parallel_map(draw, items, workers=2, seed=5) != one


def t_parallel_map_reports_a_failing_item():
    def f(x, rng):
        if x == 3:
            raise KeyError("bad item")
        return x
    e = _raises(RuntimeError, lambda: core.parallel_map(f, range(6), workers=2))
    assert "item 3" in str(e) and "KeyError" in str(e)


# ----------------------------------------------------------------------------- resumable training


def _copy_data(n=24):
    rng = random.Random(0)
    return [[0] + [rng.randrange(1, V) for _ in range(5)] for _ in range(n)]


def _weights(model):
    return [list(r) for p in model.params() for r in p.rows("data")]


class _Interrupt:
    """lm_loss that raises KeyboardInterrupt on its ``at``-th call (a Ctrl-C in the middle of a batch)."""

    def __init__(self, at):
        self.calls, self.at = 0, at
        self.__qualname__ = "lm_loss"            # the checkpoint fingerprint names the loss function

    def __call__(self, model, sample, backward=True):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return core.lm_loss(model, sample, backward=backward)


def t_resumed_training_is_bit_identical():
    data = _copy_data()
    kw = dict(epochs=3, batch_size=4, lr=5e-3, warmup=3, seed=1, workers=1, verbose=False)
    ref = _lm("rope")
    h_ref = core.train(ref, data, core.lm_loss, valid_data=data[:4], **kw)
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.json")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            _raises(KeyboardInterrupt, lambda: core.train(_lm("rope"), data, _Interrupt(31), valid_data=data[:4],
                                                        checkpoint=ck, checkpoint_every=1e9, **kw))
        assert "interrupted at step 6/18" in out.getvalue() and ck in out.getvalue()
        resumed = _lm("rope")
        h = core.train(resumed, data, core.lm_loss, valid_data=data[:4], checkpoint=ck, **kw)
        assert _weights(resumed) == _weights(ref)
        assert [s["loss"] for s in h["steps"]] == [s["loss"] for s in h_ref["steps"]]
        assert h["resumed_at_steps"] == [6] and len(h["epochs"]) == 3
        again = _lm("rope")                          # a finished checkpoint returns the trained weights at once
        assert core.train(again, data, core.lm_loss, valid_data=data[:4], checkpoint=ck, **kw)["n_steps"] == 18
        assert _weights(again) == _weights(ref)


def t_resume_with_two_workers_after_an_epoch_end_interrupt():
    data = _copy_data()
    kw = dict(epochs=2, batch_size=4, lr=5e-3, warmup=3, seed=2, workers=2, verbose=False)
    ref = _lm("sine")
    core.train(ref, data, core.lm_loss, **kw)

    def stop_after_first_epoch(model, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.json")
        with contextlib.redirect_stdout(io.StringIO()):
            _raises(KeyboardInterrupt, lambda: core.train(_lm("sine"), data, core.lm_loss, checkpoint=ck,
                                                        epoch_fn=stop_after_first_epoch, **kw))
        resumed = _lm("sine")
        core.train(resumed, data, core.lm_loss, checkpoint=ck, **kw)
        assert _weights(resumed) == _weights(ref)


def t_checkpoint_of_another_run_is_refused():
    data = _copy_data(8)
    kw = dict(epochs=1, batch_size=4, warmup=2, workers=1, verbose=False)
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.json")
        core.train(_lm("sine"), data, core.lm_loss, checkpoint=ck, **kw)
        e = _raises(core.CheckpointMismatchError,
                    lambda: core.train(_lm("rope"), data, core.lm_loss, checkpoint=ck, **kw))
        assert "config" in str(e)
        e = _raises(core.CheckpointMismatchError,
                    lambda: core.train(_lm("sine"), _copy_data(9), core.lm_loss, checkpoint=ck, **kw))
        assert "data_sha256" in str(e)
        e = _raises(core.CheckpointMismatchError,
                    lambda: core.train(_lm("sine"), data, core.lm_loss, checkpoint=ck, **dict(kw, epochs=2)))
        assert "settings" in str(e)
        with open(ck, "w") as f:
            f.write("{truncated")
        _raises(core.CheckpointMismatchError, lambda: core.train(_lm("sine"), data, core.lm_loss, checkpoint=ck, **kw))


def t_readme_decoding_example_runs():
    """The README's notebook example followed by its decoding block, run as written."""
    import re
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    first = re.search(r"<!-- example:[^>]*-->\s*```python\n(.*?)```", text, re.S).group(1)
    second = re.search(r"### Decoding, scoring and long runs\n\n```python\n(.*?)```", text, re.S).group(1)
    code = first + second + "\nassert len(best) == 5 and lp < 0 and len(out) == 3 and len(row) == len(vocab)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def t_decoding_arguments_are_checked_by_name():
    """A NaN or non-positive sampling temperature, a non-integer or negative top_k / max_new_tokens /
    backtrack, or a wrong type is a ValueError or TypeError naming the argument and its value; nothing is
    generated.  Greedy decoding ignores the temperature's value, not its type."""
    model = core.TransformerLM(5, d_model=8, n_heads=2, n_layers=1, pos="sine", seed=9)
    bad = [(dict(temperature=float("nan")), ValueError, "temperature"),
           (dict(temperature=0), ValueError, "temperature"),
           (dict(temperature=float("inf")), ValueError, "temperature"), (dict(temperature="1"), TypeError, "'1'"),
           (dict(top_k=1.5), TypeError, "top_k"), (dict(top_k=0), ValueError, "top_k"),
           (dict(top_k=True), TypeError, "top_k"), (dict(max_new_tokens=-5), ValueError, "-5"),
           (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"), (dict(backtrack=-1), ValueError, "backtrack")]
    for kwargs, exc, words in bad:
        args = {"max_new_tokens": 3, **kwargs}
        n = args.pop("max_new_tokens")
        err = _raises(exc, lambda: core.sample(model, [1], n, rng=0, **args))
        assert words in str(err), (kwargs, err)
    assert len(core.greedy_decode(model, [1], 3)) == 3                     # greedy: no temperature needed
    assert core.sample(model, [1], 0, rng=0) == []                          # zero new tokens is allowed
    assert len(core.sample(model, [1], 3, temperature=2, top_k=2, rng=0)) == 3   # an int temperature is a number


def t_generate_accepts_a_next_logits_model():
    """Any object with next_logits(ids) (generation_metrics.NgramLM, the n-gram baseline) decodes through generate's
    plain path: greedy follows the argmax of its distribution step by step, a constraint is obeyed, the
    stop reason is reported, and the same rng seed gives the same samples."""
    import generation_metrics
    seqs = [[1, 4, 5, 6, 2], [1, 4, 5, 5, 6, 2], [1, 7, 4, 2]] * 3
    m = generation_metrics.NgramLM(9, n=3, discount=0.5, bos_id=1).fit(seqs)
    new, why = core.generate(m, [1], 10, greedy=True, eos_id=2, return_reason=True)
    ids = [1]
    for t in new:
        p = m.probs(ids)
        assert t == max(range(9), key=p.__getitem__)
        ids.append(t)
    assert why == "eos" and max(range(9), key=m.probs(ids).__getitem__) == 2
    def only_4_5(tokens):
        return [4, 5] if len(tokens) < 4 else [2]
    for seed in range(5):
        out, why = core.generate(m, [1], 10, rng=seed, eos_id=2, constraint=only_4_5, backtrack=3, return_reason=True)
        assert set(out) <= {4, 5} and len(out) == 3 and why == "eos", (out, why)
        assert out == core.generate(m, [1], 10, rng=seed, eos_id=2, constraint=only_4_5, backtrack=3)

if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))


class _Listening:
    """A decoding constraint that allows ``allowed`` and, once told of a refused ``trigger``, only ``narrow``."""

    def __init__(self, allowed, trigger, narrow):
        self.allowed, self.trigger, self.narrow, self.told = allowed, trigger, narrow, []

    def __call__(self, ids):
        return self.narrow if self.told else self.allowed

    def refused(self, ids, token_id):
        self.told.append((list(ids), token_id))


def t_a_listening_constraint_hears_the_models_refused_choice_and_narrows():
    """transformer._choose: the model's own choice is offered first; a refused one is reported (here the
    argmax, id 5) and the choice is made again among what the constraint then allows; a plain constraint
    (no ``refused``) is never offered anything, and the same draw over the allowed ids results."""
    logits = [0.0, 1.0, 2.0, 0.5, 0.1, 9.0]
    pick = functools.partial(core._pick, greedy=True, temperature=1.0, top_k=None, rng=None)
    con = _Listening([1, 2, 3], trigger=5, narrow=[3, 4])
    assert core._choose(lambda row, allowed: pick(row, allowed=allowed), logits, [1, 2, 3], con, [0]) == 3
    assert con.told == [([0], 5)]
    def plain(ids):
        return [1, 2, 3]
    assert core._choose(lambda row, allowed: pick(row, allowed=allowed), logits, [1, 2, 3], plain, [0]) == 2
    # over many draws, a listener that narrows nothing gives the distribution of drawing among the allowed
    rng = random.Random(3)
    def draw(row, allowed):
        return core._pick(row, False, 1.0, None, rng, allowed)
    quiet = _Listening([1, 2, 3], trigger=None, narrow=[1, 2, 3])
    counts = collections.Counter(core._choose(draw, logits, [1, 2, 3], quiet, [0]) for _ in range(20000))
    p = [math.exp(logits[i]) for i in (1, 2, 3)]
    for i, pi in zip((1, 2, 3), p):
        assert abs(counts[i] / 20000 - pi / sum(p)) < 0.015, (i, counts)


def t_listening_constraint_cached_equals_plain_and_backtracking_keeps_listening():
    """generate with a listening constraint: the cached and the plain path choose the same ids (the refusal is
    heard at the same step), and with backtrack the narrowed set is honoured too."""
    model = core.TransformerLM(6, 8, 2, 1, 16, seed=4)
    outs = []
    for use_cache, backtrack in ((True, 0), (False, 0), (True, 3)):
        con = _Listening([1, 2, 3, 4, 5], trigger=None, narrow=[2])
        new = core.generate(model, [0], 12, rng=11, constraint=con, use_cache=use_cache, backtrack=backtrack)
        outs.append((new, [(len(ids), t) for ids, t in con.told]))
    assert outs[0] == outs[1] == outs[2]
    new, told = outs[0]
    assert told and told[0][1] == 0, "the model should choose id 0 (never allowed) at some step"
    assert all(t == 2 for t in new[told[0][0] - 1:]) and len(new) == 12    # from that step on: only id 2


class _Lazy:
    """A constraint with a costly check (transformer._pick_confirmed): ``candidates`` answers a superset, ``confirm``
    passes only the ids in ``good`` (none at every ``dead``-th position: a dead end for backtracking) and counts how
    often it is asked; ``__call__`` is the exact answer.  ``refused`` (when ``listening``) records what it hears."""

    def __init__(self, candidates, good, dead=None, listening=False):
        self.cands, self.good, self.dead, self.asked, self.told = list(candidates), set(good), dead, 0, []
        if listening:
            self.refused = lambda ids, token_id: self.told.append((len(ids), token_id))

    def _ok(self, ids, token_id):
        return token_id in self.good and not (self.dead and len(ids) % self.dead == 0)

    def candidates(self, ids):
        return self.cands

    def confirm(self, ids, token_id):
        self.asked += 1
        return self._ok(ids, token_id)

    def __call__(self, ids):
        return [i for i in self.cands if self._ok(ids, i)]


def t_a_lazy_constraint_draws_as_if_the_unconfirmed_ids_were_masked():
    """transformer._pick_confirmed: greedy and top-k draw the very ids a constraint answering the exact set gives
    (the same ids, the same random numbers; cached, plain and backtracking through dead ends; with and without a
    listener for refusals), checking fewer ids; without a rank cut a failed draw is redrawn among the rest,
    which is the masked softmax p_i / sum_{j passes} p_j; a pick that declares no rank cut gets every id checked."""
    model = core.TransformerLM(V, 8, 2, 1, 16, seed=4)
    for kw in (dict(greedy=True), dict(top_k=3, temperature=1.3), dict(top_k=1)):
        for use_cache, backtrack, dead, listening in ((True, 0, None, False), (False, 0, None, True),
                                                      (True, 3, 5, False), (False, 3, 5, True)):
            lazy, exact = (_Lazy(range(V), {1, 3, 4, 6}, dead, listening) for _ in range(2))
            run = functools.partial(core.generate, model, [0], 15, rng=5, use_cache=use_cache, backtrack=backtrack,
                                    return_reason=True, **kw)
            assert run(constraint=lazy) == run(constraint=_ExactOnly(exact)), (kw, use_cache)   # masked first
            assert lazy.told == exact.told and 0 < lazy.asked < 15 * V   # fewer checks than every id at every step
    logits = [0.3, 2.0, 1.0, 1.5, -0.5, 2.5]
    rng = random.Random(3)
    def draw(row, allowed):
        return core._pick(row, False, 1.0, None, rng, allowed)
    good = {1, 3, 4}
    counts = collections.Counter(core._pick_confirmed(draw, logits, range(6), good.__contains__) for _ in range(20000))
    z = sum(math.exp(logits[i]) for i in good)
    assert set(counts) == good
    for i in good:
        assert abs(counts[i] / 20000 - math.exp(logits[i]) / z) < 0.015, (i, counts)
    assert core._pick_confirmed(draw, logits, range(6), lambda i: False) is None
    def top2(row, allowed):                        # a rank cut it does not declare: every candidate confirmed first
        return core._pick(row, False, 1.0, 2, random.Random(0), allowed)
    lazy = _Lazy(range(6), {1, 3, 4})
    assert core._choose(top2, logits, list(range(6)), lazy, [0]) in (1, 3) and lazy.asked >= 6   # all 6 checked


class _ExactOnly:
    """A plain constraint: the exact answer of ``inner`` (and its listener), no lazy hook."""

    def __init__(self, inner):
        self.inner = inner
        if hasattr(inner, "refused"):
            self.refused = inner.refused

    def __call__(self, ids):
        return self.inner(ids)
