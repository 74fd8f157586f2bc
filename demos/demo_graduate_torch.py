"""Graduate to PyTorch (beyond the tutorial): experiment 9's model as a torch module through
torch_bridge.py, what torch's engine buys on this machine, and what scale buys on experiment 9.

What it does
------------
Data: experiment 9's (demos/demo_reaction_seq2seq.py, imported, not copied): USPTO-50K single-product
reactions, both sides at most 48 characters, its seeded 800 training reactions, 100 validation and 500
test reactions, its shared atom-level vocabulary.  torch runs with torch.set_num_threads(2).

(a) speed, in one run, on the same batches from the same initial weights: seconds per optimiser step
    of ``transformer.train`` (pure Python, 2 workers) against ``torch_bridge.train_torch`` (2 threads,
    float64 and float32), for experiment 9's reference model (d = 48, 2 + 2 layers, batch 8) over its
    first ``n_speed`` steps, and for experiment 4's d = 48 LM shape (2 layers, tied head, batch 8) on
    the training products' token sequences over ``n_speed_lm`` steps.  Ratio = pure Python / torch.
(b) the reference training reproduced: experiment 9's whole reference run (800 x 3 epochs, 300 steps,
    validation each epoch) with train_torch in float64; its per-step losses against the pure-Python
    run's of (a) over the first ``n_match`` steps (must agree within 1e-9), its wall time beside the
    pure-Python time of those steps scaled to the run.  For ``n_beam_check`` test reactions the torch
    beam search (width 5) of the trained module gives the same top beam as our ``beam_search`` on
    ``from_torch(module)``.
(c) with --extended only (about 2 x ``budget_minutes`` + ``calibration_minutes`` + 30 minutes of scoring
    on 2 idle cores): what scale buys, as a curve.  FULL["scale"] below is trained with train_torch on the whole
    training split in float32, in chunks of ``chunk_steps`` steps, checkpointed (torch.save) after
    every chunk, so an interrupted run (Ctrl-C included) resumes with the same command.  When the
    training time passes each of ``score_minutes`` (and at the end of the budget) the model is scored on
    experiment 9's 500 test reactions: greedy and beam 5 decoded in torch, experiment 9's metrics
    (canonical exact match, validity, Tanimoto, atom conservation) and its copy-largest-reactant
    baseline.  Every point's predictions are stored.  The calibration row: a plain ``torch.nn.Transformer``
    (same width, depth, data, batch, schedule; dropout 0.1, torch's own layers) trained for
    ``calibration_minutes`` and scored with greedy decoding the same way.  The same-size curve,
    FULL["same_size"]: experiment 9's own model (d = 48, 2 + 2 layers, d_ff = 96) with the wide curve's
    data and recipe, so the wide curve's gain over experiment 9 splits into what the whole training split
    buys at experiment 9's size and what the width adds.  Its budget is in steps, against the wide curve's
    point at ``match_minutes`` (20: the first point clearly off the floor, the curve still rising; the
    60-minute point's compute would cost an hour of an idle host, many at this shared host's usual load):
    "equal steps" (the same training examples seen) and "equal compute" (that step count times the wide
    model's step cost over the smaller one's, measured here in ``ratio_rounds`` interleaved rounds).  Wall
    minutes are no budget on a shared host: other work slows the same training several-fold.  From the stored
    predictions, each curve's final point is compared with copy (paired over the reactions both sides
    score) and split by outcome (exact hit / valid but wrong / invalid, copy's Tanimoto on each part),
    and the same-size final point is compared with the wide one, paired over the same reactions.

Why the scale model is d = 128, 3 + 3 layers: the calibration measured here found d = 256 reaches only
1,054 steps in 15 minutes (3.5 epochs, valid 0.228) while d = 128 reaches 2,015 steps in 13 (7 epochs,
valid 0.412) with its loss still falling: on 2 cores the number of steps, not the width, limits an
hour, so the narrower model gets more of them.  Batch 64 (the calibration's), lr 1e-3 after 300
warmup steps (about one epoch) then inverse-sqrt decay (our schedule), label smoothing 0.1 (the Molecular
Transformer's; it helps beam lists), no randomized-SMILES augmentation (an hour is about 7 epochs:
the model is far from memorising the 19,345 reactions, which is what augmentation counters), float32
(float64 is only needed for the bit-level comparisons of (a)/(b)).

How to read results_graduate_torch.json (under "results")
---------------------------------------------------------
speed.<model>            pure_python_s_per_step, torch64_s_per_step, torch32_s_per_step, ratio64, ratio32,
                         n_steps, batch_size, params, workers, torch_threads, cpu_count, load_average_1min
                         (the machine's 1-minute load before and after: other work inflates the times)
reproduce                n_steps, max_abs_loss_diff_first_n (the first n_match steps), curve_torch, curve_python
                         (loss per step), torch_wall_s, python_wall_s_estimate (the pure-Python s/step of
                         (a) x the run's steps; its validation passes not included), epochs (torch run)
beam_check               n, same_top_beam (torch beam vs our beam_search on from_torch(module))
scale                    (with --extended) config, params, n_train, points[*] (train_minutes, steps, epochs,
                         train_loss, metrics.{greedy,beam5}: top1, top3, top5, valid, tanimoto, conserved,
                         load_average_1min), beam_check, baselines.copy_largest, comparisons[*] (the last point's
                         beam 5 and greedy against copy_largest per metric, experiment 9's record: paired
                         bootstrap over the reactions both sides score), outcomes (the last point's beam-5 top-1:
                         exact / valid_wrong / invalid, each {n, tanimoto, copy_tanimoto}; valid_wrong.comparison
                         the paired one on those reactions), threads, host (load and matmul speed at the start and
                         end), resumed (True when the training and its scored points were taken from the
                         checkpoint folder an earlier call of the same command left)
same_size                (with --extended, or --add-same-size) the same fields for the same-size curve (its
                         points also: kind = equal steps / equal compute, matches = the wide point's key,
                         equivalent_minutes = the wide host's minutes for that compute), budget (ratio: the wide
                         model's seconds per step over the smaller one's; rounds), and against_scale[*]: each
                         point against the wide point it matches, beam 5, top1 and tanimoto, paired over the
                         same reactions
calibration              (with --extended) config, params, minutes, steps, metrics.greedy
predictions              per test reaction: product, and per scored point <key> = scale_<minutes>min and
                         same_size_<steps>steps (each curve's last one also "scale_final" / "same_size_final") its
                         "greedy" string and "beam" list; calibration_greedy
checks                   self-checks that must all be True

Run:  python demos/demo_graduate_torch.py                  (a) and (b): about 3-5 min on 2 idle cores
      python demos/demo_graduate_torch.py --extended [--budget-minutes 60] [--calibration-minutes 13]
      QUICK=1 python demos/demo_graduate_torch.py [--extended]   (smoke run, about a minute)
      python demos/demo_graduate_torch.py --add-same-size         (only the same-size curve, into the existing
                                                                   results: about 20 min of training on an idle
                                                                   host plus scoring, several times that on a busy one)
      python demos/demo_graduate_torch.py --rescore               (recompute what is scored from the stored
                                                                   predictions: a few minutes)
"""
import json
import math
import os
import time
import warnings

import common
import demo_reaction_seq2seq as rx

import report_kit as kit

import reactions
import safe_io

core = common.core

FULL = dict(n_speed=50, n_speed_lm=20, n_match=50, n_beam_check=10, threads=2, workers=2,
            lm=dict(d_model=48, n_heads=4, n_layers=2, d_ff=96, pos="sine", tie_weights=True,
                    batch_size=8, lr=3e-3, warmup=100),
            scale=dict(d_model=128, n_heads=8, n_layers=3, d_ff=512, pos="sine", max_len=64, batch_size=64,
                       lr=1e-3, warmup=300, clip=1.0, label_smoothing=0.1, epochs=1000, chunk_steps=50,
                       score_minutes=[5, 10, 20, 40, 60], n_train=None),
            budget_minutes=60.0, calibration_minutes=13.0)
# experiment 9's model with the wide curve's recipe, budgeted against the wide curve's 20-minute point (see
# same_size_marks and the module docstring)
FULL["same_size"] = dict(FULL["scale"], **rx.FULL["model"], match_minutes=[20], ratio_rounds=3,
                         kinds=["equal steps", "equal compute"])
QUICK_OVERRIDES = dict(n_speed=3, n_speed_lm=3, n_match=3, n_beam_check=3,
                       lm=dict(FULL["lm"], d_model=16, n_heads=2, n_layers=1, d_ff=32),
                       scale=dict(FULL["scale"], d_model=16, n_heads=2, n_layers=1, d_ff=32, batch_size=8,
                                  warmup=5, chunk_steps=4, score_minutes=[0.01], n_train=200),
                       budget_minutes=0.03, calibration_minutes=0.01)
# QUICK: a model smaller than the QUICK wide one (experiment 9's QUICK model has the wide one's size)
QUICK_OVERRIDES["same_size"] = dict(QUICK_OVERRIDES["scale"], d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                    match_minutes=[0.03], ratio_rounds=1, kinds=FULL["same_size"]["kinds"])
MODEL_KEYS = ("d_model", "n_heads", "n_layers", "d_ff", "pos", "max_len")
BUDGET_KEYS = ("match_minutes", "ratio_rounds", "kinds")


def torch_modules():
    """torch and torch_bridge, imported late (the registry and the tests import this file without them)."""
    import torch
    import torch_bridge as tb
    return torch, tb


# ----------------------------------------------------------------------------- (a) speed


def time_steps(fn):
    t0 = time.perf_counter()
    hist = fn()
    return hist, time.perf_counter() - t0


def speed_pair(model_fn, data, loss, kw, workers, n_steps):
    """Pure Python (``workers``) and torch (float64, float32) on the same batches: their histories and
    seconds per step (wall time of a max_steps=n_steps call, process start-up included, / steps; torch
    after a one-step warm-up on a copy, so its one-time set-up costs are not counted)."""
    torch, tb = torch_modules()
    kw = dict(kw, max_steps=n_steps, verbose=False, epochs=max(1, math.ceil(n_steps * kw["batch_size"] / len(data))))
    model = model_fn()
    m64, m32 = tb.to_torch(model, torch.float64), tb.to_torch(model, torch.float32)
    for dt in (torch.float64, torch.float32):                           # warm-up: torch's one-time costs
        tb.train_torch(tb.to_torch(model, dt), data, loss, **dict(kw, max_steps=1))
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    py, t_py = time_steps(lambda: core.train(model, data, loss, workers=workers, **kw))
    h64, t64 = time_steps(lambda: tb.train_torch(m64, data, loss, **kw))
    h32, t32 = time_steps(lambda: tb.train_torch(m32, data, loss, **kw))
    n = py["n_steps"]
    rec = {"n_steps": n, "batch_size": kw["batch_size"], "params": core.param_count(model), "workers": workers,
           "torch_threads": torch.get_num_threads(), "pure_python_s_per_step": t_py / n,
           "torch64_s_per_step": t64 / n, "torch32_s_per_step": t32 / n,
           "ratio64": t_py / t64, "ratio32": t_py / t32, "cpu_count": os.cpu_count(),
           "load_average_1min": [load0, os.getloadavg()[0] if load0 is not None else None]}
    return rec, py, h64


def speed(run, cfg, vocab, train_pairs, seed):
    """(a) for the reference EncoderDecoder and the d = 48 LM; returns (records, pure-Python history of
    the reference model's first steps)."""
    ref = rx.FULL if not common.QUICK else dict(rx.FULL, **rx.QUICK_OVERRIDES)
    V = len(vocab)
    ref_kw = dict(batch_size=ref["batch_size"], lr=ref["lr"], warmup=ref["warmup"], clip=ref["clip"], seed=seed)
    rec_ref, py, _ = speed_pair(lambda: core.EncoderDecoder(V, V, seed=seed, **ref["model"]), train_pairs,
                                rx.make_loss(ref["label_smoothing"]), ref_kw, cfg["workers"], cfg["n_speed"])
    run.log(f"reference model: {rec_ref['pure_python_s_per_step']:.3f} s/step pure Python, "
            f"{rec_ref['torch64_s_per_step']:.4f} float64 torch ({rec_ref['ratio64']:.0f}x)")
    lm = cfg["lm"]
    lm_data = [t for _, t in train_pairs]
    rec_lm, _, _ = speed_pair(
        lambda: core.TransformerLM(V, d_model=lm["d_model"], n_heads=lm["n_heads"], n_layers=lm["n_layers"],
                                 d_ff=lm["d_ff"], pos=lm["pos"], tie_weights=lm["tie_weights"], seed=seed),
        lm_data, core.lm_loss, dict(batch_size=lm["batch_size"], lr=lm["lr"], warmup=lm["warmup"], clip=1.0,
                                  seed=seed), cfg["workers"], cfg["n_speed_lm"])
    run.log(f"d = {lm['d_model']} LM: {rec_lm['pure_python_s_per_step']:.3f} s/step pure Python, "
            f"{rec_lm['torch64_s_per_step']:.4f} float64 torch ({rec_lm['ratio64']:.0f}x)")
    return {"reference": dict(rec_ref, config=ref["model"]), "lm_d48": dict(rec_lm, config=lm)}, py


# ----------------------------------------------------------------------------- (b) the reference run


def reproduce(run, cfg, vocab, train_pairs, valid_pairs, py_hist, s_per_step_py, seed):
    """(b): experiment 9's reference training with train_torch in float64; returns (record, module)."""
    torch, tb = torch_modules()
    ref = rx.FULL if not common.QUICK else dict(rx.FULL, **rx.QUICK_OVERRIDES)
    V = len(vocab)
    module = tb.to_torch(core.EncoderDecoder(V, V, seed=seed, **ref["model"]), torch.float64)
    hist, wall = time_steps(lambda: tb.train_torch(
        module, train_pairs, rx.make_loss(ref["label_smoothing"]), valid_data=valid_pairs, epochs=ref["epochs"],
        batch_size=ref["batch_size"], lr=ref["lr"], warmup=ref["warmup"], clip=ref["clip"], seed=seed,
        tag="graduate_reference_torch"))
    n = min(cfg["n_match"], len(py_hist["steps"]), len(hist["steps"]))
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(py_hist["steps"][:n], hist["steps"][:n])]
    rec = {"n_steps": hist["n_steps"], "n_match": n, "max_abs_loss_diff_first_n": max(diffs),
           "curve_torch": [s["loss"] for s in hist["steps"]], "curve_python": [s["loss"] for s in py_hist["steps"]],
           "torch_wall_s": wall, "python_wall_s_estimate": s_per_step_py * hist["n_steps"],
           "epochs": hist["epochs"], "config": ref["model"]}
    run.log(f"reference run in torch float64: {hist['n_steps']} steps in {common.fmt_time(wall)}; first {n} "
            f"losses within {rec['max_abs_loss_diff_first_n']:.1e} of pure Python")
    return rec, module


# ----------------------------------------------------------------------------- decoding in torch


def device_of(module):
    """The device of a torch module's parameters (of the wrapped module under DistributedDataParallel)."""
    return next(getattr(module, "module", module).parameters()).device


def pad_batch(rows, value, device):
    """Right-pad lists of ids to one (B, T) long tensor, and the (B, T) mask of real positions."""
    torch, _ = torch_modules()
    T = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [value] * (T - len(r)) for r in rows], dtype=torch.long, device=device)
    real = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows], device=device)
    return ids, real


def torch_greedy(module, srcs, bos, eos, max_new, batch=128):
    """Greedy decoding of every source (lists of ids) with the torch module, batched: new ids without eos."""
    torch, _ = torch_modules()
    dev, out = device_of(module), []
    with torch.no_grad():
        for s in range(0, len(srcs), batch):
            src, real = pad_batch(srcs[s:s + batch], 0, dev)
            mask = ~real
            mem = module.encode(src, mask)
            ys = torch.full((src.shape[0], 1), bos, dtype=torch.long, device=dev)
            done = torch.zeros(src.shape[0], dtype=torch.bool, device=dev)
            for _ in range(max_new):
                nxt = module.decode(ys, mem, mask)[:, -1].argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
                ys, done = torch.cat([ys, nxt[:, None]], 1), done | (nxt == eos)
                if bool(done.all()):
                    break
            for row in ys[:, 1:].tolist():
                out.append(row[:row.index(eos)] if eos in row else row)
    return out


def _beam_candidates(module, mem, mask, live, bos, width):
    """The 2 * width best one-token extensions of the live beams, as (logprob, ids), best first."""
    torch, _ = torch_modules()
    L = len(live)
    ys = torch.tensor([[bos] + ids for _, ids in live], dtype=torch.long, device=mem.device)
    logits = module.decode(ys, mem.expand(L, -1, -1), mask.expand(L, -1))[:, -1].double()
    tot = torch.log_softmax(logits, -1) + torch.tensor([lp for lp, _ in live], dtype=torch.float64,
                                                       device=mem.device)[:, None]
    V = tot.shape[1]
    vals, idx = tot.flatten().topk(min(2 * width, tot.numel()))
    cand = [(v, live[i // V][1] + [i % V]) for v, i in zip(vals.tolist(), idx.tolist())]
    return sorted(cand, key=lambda c: (-c[0], c[1]))


def torch_beam(module, src, bos, eos, width, max_new, length_penalty=1.0):
    """transformer.beam_search's algorithm (no constraint) on the torch module: up to ``width``
    (ids, logprob, score), finished ones first, best first."""
    torch, _ = torch_modules()
    with torch.no_grad():
        srct = torch.tensor([src], dtype=torch.long, device=device_of(module))
        mask = torch.zeros_like(srct, dtype=torch.bool)
        mem = module.encode(srct, mask)
        live, finished = [(0.0, [])], []
        for _ in range(max_new):
            new = []
            for rank, (lp, ids) in enumerate(_beam_candidates(module, mem, mask, live, bos, width)):
                if ids[-1] == eos:
                    if rank < width:
                        finished.append(core.Hypothesis.scored(ids[:-1], lp, "eos", length_penalty))
                elif len(new) < width:
                    new.append((lp, ids))
                if len(new) == width and rank >= width - 1:
                    break
            live = new
            if len(finished) >= width or not live:
                break
    stopped = [core.Hypothesis.scored(ids, lp, "max_new_tokens", length_penalty) for lp, ids in live]
    def order(h):
        return (-h.score, -h.logprob, h.ids)
    return (sorted(finished, key=order) + sorted(stopped, key=order))[:width]


def beam_check(module, vocab, test_pairs, cfg, width=5, length_penalty=1.0):
    """Top beam of the torch beam search == our beam_search on from_torch(module), on the first pairs."""
    _, tb = torch_modules()
    ours_model = tb.from_torch(module)
    pairs = test_pairs[:cfg["n_beam_check"]]
    same = 0
    for src, _ in pairs:
        theirs = torch_beam(module, src, vocab.bos_id, vocab.eos_id, width, rx.FULL["max_new_tokens"], length_penalty)
        ours = core.beam_search(ours_model, [vocab.bos_id], width, rx.FULL["max_new_tokens"], src=src,
                              eos_id=vocab.eos_id, length_penalty=length_penalty)
        same += bool(theirs) and bool(ours) and theirs[0].ids == ours[0].ids
    return {"n": len(pairs), "same_top_beam": same, "width": width}


def score(module, vocab, test, test_pairs, beam_width=5, with_beam=True):
    """Experiment 9's metric blocks (test500) of greedy and beam decoding in torch, and the predictions."""
    module.eval()
    T = rx.FULL["max_new_tokens"]
    greedy = [rx.ids_to_smiles(vocab, ids) for ids in
              torch_greedy(module, [s for s, _ in test_pairs], vocab.bos_id, vocab.eos_id, T)]
    cfg = {"n_test_ref": len(test)}
    out = {"greedy": rx.metric_block([[p] for p in greedy], test, cfg)[0]["test500"]}
    beams = None
    if with_beam:
        beams = [[rx.ids_to_smiles(vocab, h.ids) for h in torch_beam(module, s, vocab.bos_id, vocab.eos_id,
                                                                      beam_width, T)] for s, _ in test_pairs]
        out[f"beam{beam_width}"] = rx.metric_block(beams, test, cfg, greedy=greedy)[0]["test500"]
    module.train()
    return out, greedy, beams


# ----------------------------------------------------------------------------- (c) what scale buys


def plain_transformer(config, seed):
    """The calibration model: torch.nn.Transformer (pre-LN, dropout 0.1) between token embeddings with
    sine positions and a linear head, with the encode / decode / forward interface of the bridged module."""
    torch, _ = torch_modules()
    nn = torch.nn

    class PlainTransformer(nn.Module):
        kind = "nn.Transformer"

        def __init__(self, c):
            super().__init__()
            self.config, d = dict(c), c["d_model"]
            self.src_tok, self.tgt_tok = nn.Embedding(c["src_vocab_size"], d), nn.Embedding(c["tgt_vocab_size"], d)
            with warnings.catch_warnings():                             # "nested tensors unused": fine
                warnings.simplefilter("ignore", UserWarning)
                self.core = nn.Transformer(d, c["n_heads"], c["n_layers"], c["n_layers"], c["d_ff"],
                                           dropout=0.1, batch_first=True, norm_first=True)
            self.head = nn.Linear(d, c["tgt_vocab_size"])
            self.register_buffer("pe", torch.tensor(core.sine_cosine_table(c["max_len"], d), dtype=torch.float32))

        def _embed(self, emb, ids):
            return emb(ids) * math.sqrt(self.config["d_model"]) + self.pe[:ids.shape[1]]

        def encode(self, src, mask):
            return self.core.encoder(self._embed(self.src_tok, src), src_key_padding_mask=mask)

        def decode(self, tgt, memory, mask):
            T = tgt.shape[1]
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt.device), 1)
            return self.head(self.core.decoder(self._embed(self.tgt_tok, tgt), memory, tgt_mask=causal,
                                               memory_key_padding_mask=mask))

        def forward(self, src, tgt_in, src_pad_mask=None):
            return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask)

    torch.manual_seed(seed)
    return PlainTransformer(config)


def train_for(module, pairs, sc, minutes, ck_path, seed, tag, log, steps=None):
    """train_torch in chunks of chunk_steps until its (checkpointed) training time passes ``minutes`` or, with
    ``steps``, until it has taken that many optimiser steps; every chunk ends with a checkpoint, so a rerun
    continues.  Returns the last history."""
    _, tb = torch_modules()
    max_steps, last_log = min(sc["chunk_steps"], steps or sc["chunk_steps"]), 0.0
    while True:
        hist = tb.train_torch(module, pairs, rx.make_loss(sc["label_smoothing"]), epochs=sc["epochs"],
                              batch_size=sc["batch_size"], lr=sc["lr"], warmup=sc["warmup"], clip=sc["clip"],
                              seed=seed, max_steps=max_steps, checkpoint=ck_path, checkpoint_every=60.0,
                              verbose=False, tag=tag)
        if hist["wall_time"] - last_log >= 120:
            last_log = hist["wall_time"]
            log(f"{tag}: step {hist['n_steps']}, {hist['wall_time'] / 60:.1f} training minutes, "
                f"loss {hist['steps'][-1]['loss']:.4f}" if hist["steps"] else f"{tag}: resumed")
        done = hist["n_steps"] >= steps if steps else hist["wall_time"] >= minutes * 60
        if done or hist["n_steps"] < max_steps:
            return hist
        max_steps = (hist["n_steps"] + sc["chunk_steps"] if not steps
                     else min(steps, hist["n_steps"] + sc["chunk_steps"]))


def scale_data(rows, sc, seed):
    """The whole training split (or n_train of it), experiment 9's valid / test samples, and the vocabulary."""
    ref = rx.FULL if not common.QUICK else dict(rx.FULL, **rx.QUICK_OVERRIDES)
    pool = [r for r in rows if r["split"] == "train"]
    sets = rx.select(rows, dict(ref, n_train=sc["n_train"] or len(pool)), seed)
    vocab = rx.build_vocab(sets["train"])
    return sets, vocab, rx.encode(vocab, sets["train"]), rx.encode(vocab, sets["test"])


def point_record(hist, metrics, n_train, batch_size):
    """One point of the curve: training minutes, steps, epochs, the mean loss of the last 20 steps."""
    recent = [s["loss"] for s in hist["steps"][-20:]]
    return {"train_minutes": hist["wall_time"] / 60, "steps": hist["n_steps"],
            "epochs": hist["n_steps"] * batch_size / n_train,
            "train_loss": sum(recent) / len(recent) if recent else None, "metrics": metrics}


CURVES = {"scale": "torch scale", "same_size": "torch same size"}   # config key -> method name in comparisons


def _load_points(path):
    """The scored points and predictions an earlier call of the same curve left beside its checkpoint, and
    whether there were any."""
    if not os.path.exists(path):
        return {"points": [], "predictions": {}}, False
    with open(path, encoding="utf-8") as f:
        return json.load(f), True


def minute_marks(cfg, name):
    """The scoring marks of a curve budgeted in training minutes: every score_minutes below budget_minutes,
    and budget_minutes."""
    ms = sorted({m for m in cfg[name]["score_minutes"] if m < cfg["budget_minutes"]} | {cfg["budget_minutes"]})
    return [{"key": f"{name}_{m:g}min", "mark_minutes": m} for m in ms]


def step_cost_ratio(run, cfg, pairs, vocab_size, seed):
    """Seconds per optimiser step of the wide model over the same-size model, measured here back to back in
    ``ratio_rounds`` interleaved rounds (each: a fresh model's calls of 5 and of 25 steps, the difference / 20,
    so set-up costs cancel); the median ratio, so the load of a shared host, which slows both alike, drops
    out.  Returns {ratio, rounds: [{wide_s_per_step, same_size_s_per_step, load_average_1min}]}."""
    torch, tb = torch_modules()

    def per_step(name):
        sc = cfg[name]
        times = []
        for n in (5, 25):
            module = tb.to_torch(core.EncoderDecoder(vocab_size, vocab_size, seed=seed,
                                                     **{k: sc[k] for k in MODEL_KEYS}),
                                 torch.float32)
            t0 = time.perf_counter()
            tb.train_torch(module, pairs, rx.make_loss(sc["label_smoothing"]), epochs=sc["epochs"],
                           batch_size=sc["batch_size"], lr=sc["lr"], warmup=sc["warmup"], clip=sc["clip"], seed=seed,
                           max_steps=n, verbose=False)
            times.append(time.perf_counter() - t0)
        return (times[1] - times[0]) / 20
    rounds = []
    for _ in range(cfg["same_size"]["ratio_rounds"]):
        w, s_ = per_step("scale"), per_step("same_size")
        rounds.append({"wide_s_per_step": w, "same_size_s_per_step": s_, "load_average_1min": os.getloadavg()[0]})
        run.log(f"step cost: wide {w:.3f} s, same size {s_:.3f} s (ratio {w / s_:.2f})")
    ratios = sorted(x["wide_s_per_step"] / x["same_size_s_per_step"] for x in rounds)
    return {"ratio": ratios[len(ratios) // 2], "rounds": rounds}


def same_size_marks(cfg, wide, budget):
    """The scoring marks of the same-size curve, budgeted in steps against the wide curve's points of
    match_minutes: for each, its own step count ("equal steps": the same examples seen) and that count times
    the step-cost ratio ("equal compute": the steps the smaller model takes in the wide one's training time,
    on the same host); each mark names the wide point it matches and its wide-host equivalent minutes."""
    out = {}
    for m in cfg["same_size"]["match_minutes"]:
        # the mark, or the last before it
        p = ([x for x in wide["points"] if x["mark_minutes"] <= m] or wide["points"])[-1]
        marks = (("equal steps", p["steps"]), ("equal compute", max(1, round(p["steps"] * budget["ratio"]))))
        for kind, steps in ((k, n) for k, n in marks if k in cfg["same_size"]["kinds"]):
            kind = "equal steps and compute" if steps in out and out[steps]["matches"] == p["key"] else kind
            out[steps] = {"key": f"same_size_{steps}steps", "mark_steps": steps, "kind": kind, "matches": p["key"],
                          "equivalent_minutes": p["train_minutes"] * steps / (p["steps"] * budget["ratio"])}
    return [out[k] for k in sorted(out)]


def curve_study(run, cfg, rows, seed, name="scale", wide=None):
    """(c): one curve (``name``: "scale", the wide model, budgeted in training minutes; or "same_size",
    experiment 9's model size, budgeted in steps against ``wide``, the wide curve's record: see
    same_size_marks), trained on the whole training split and scored at every mark; the state of every
    scored point (and the same-size curve's measured step-cost ratio) is kept beside the checkpoint
    (<name>_points.json), so a resumed run neither measures nor scores twice.  Returns (record,
    predictions per point key, test rows)."""
    torch, tb = torch_modules()
    sc = cfg[name]
    sets, vocab, pairs, test_pairs = scale_data(rows, sc, seed)
    V, test = len(vocab), sets["test"]
    module = tb.to_torch(core.EncoderDecoder(V, V, seed=seed, **{k: sc[k] for k in MODEL_KEYS}), torch.float32)
    folder = os.path.join(run.out_dir, "checkpoints", run.name)
    points_path = os.path.join(folder, f"{name}_points.json")
    state, resumed = _load_points(points_path)
    if wide is not None and "budget" not in state:
        state["budget"] = step_cost_ratio(run, cfg, pairs, V, seed)
        safe_io.write_json(points_path, state)
    marks = same_size_marks(cfg, wide, state["budget"]) if wide is not None else minute_marks(cfg, name)
    load0, speed0 = os.getloadavg()[0], common.machine_speed()
    run.log(f"{name}: {len(pairs)} training reactions, V = {V}, {core.param_count(tb.from_torch(module)):,} "
            f"parameters, scoring at {[m.get('mark_minutes', m.get('mark_steps')) for m in marks]}")
    for mark in marks:
        hist = train_for(module, pairs, sc, mark.get("mark_minutes"), os.path.join(folder, f"{name}.pt"), seed,
                         name, run.log, steps=mark.get("mark_steps"))
        if mark["key"] in state["predictions"] or (state["points"] and state["points"][-1]["steps"] == hist["n_steps"]):
            continue                                                    # scored already, or that mark was passed
        metrics, greedy, beams = score(module, vocab, test, test_pairs)
        rec = dict(point_record(hist, metrics, len(pairs), sc["batch_size"]), **mark,
                   load_average_1min=os.getloadavg()[0])
        state["points"].append(rec)
        state["predictions"][mark["key"]] = {"greedy": greedy, "beam": beams}
        safe_io.write_json(points_path, state)
        run.log(f"{name} at {rec['train_minutes']:.1f} min ({hist['n_steps']} steps): beam-5 top-1 "
                f"{metrics['beam5']['top1']:.3f}, valid {metrics['beam5']['valid']:.3f}, Tanimoto "
                f"{metrics['beam5']['tanimoto']:.3f}")
    copy, _ = rx.metric_block([reactions.copy_largest_reactant(r["reactants"], k=5) for r in test], test,
                              {"n_test_ref": len(test)})
    rec = {"config": sc, "params": core.param_count(tb.from_torch(module)), "n_train": len(pairs), "vocab_size": V,
           "points": state["points"], "beam_check": beam_check(module, vocab, test_pairs, cfg),
           "baselines": {"copy_largest": copy["test500"]}, "threads": torch.get_num_threads(), "device": "cpu",
           "resumed": resumed, "host": {"load_average_1min": [load0, os.getloadavg()[0]],
                                        "matmul_mflops": {"start": speed0, "end": common.machine_speed()}}}
    if "budget" in state:
        rec["budget"] = state["budget"]
    return rec, state["predictions"], test


# ----------------------------------------------------------------------------- (c) scored from the predictions


def _test_rows(preds):
    """The test reactions of stored predictions, as experiment 9's rows (row, class, reactants, product)."""
    return [{"row": p["row"], "class": p["class"], "reactants": p["source"], "product": p["product"]} for p in preds]


def _final_lists(preds, name):
    """{"beam5": ranked lists, "greedy": [[string]]} of a curve's last scored point, per test reaction."""
    key = f"{name}_final"
    return {"beam5": [p[key]["beam"] for p in preds], "greedy": [[p[key]["greedy"]] for p in preds]}


def _scores(lists, test):
    return [reactions.score_prediction(ranked, r["product"], r["reactants"]) for ranked, r in zip(lists, test)]


def curve_comparisons(name, preds, test, copy_scores):
    """A curve's final point, beam 5 and greedy, against copying the largest reactant on the same test
    reactions, per metric of experiment 9, each paired over the reactions both sides score
    (``demo_reaction_seq2seq.paired_comparison``; one seed, so the bootstrap interval decides)."""
    out, b = [], rx.item_scores("copy_largest", copy_scores, test)
    for method, lists in _final_lists(preds, name).items():
        a = rx.item_scores(f"{CURVES[name]}, {method}", _scores(lists, test), test)
        out += [c for c in (rx.paired_comparison(a, b, m, "test500") for m in rx.COMPARED_METRICS) if c]
    return out


def outcomes(name, preds, test, copy_scores):
    """A curve's final point (beam 5 top-1) split by outcome: exact hit, valid but wrong, invalid; per part the
    number of reactions, the model's mean Tanimoto and copy's on the same reactions, and on the valid but wrong
    ones the paired comparison of the two (so a mean Tanimoto level with copy's can be read as hits offsetting
    wrong answers, or not)."""
    scores = _scores(_final_lists(preds, name)["beam5"], test)
    part = ["exact" if s["rank"] == 1 else "valid_wrong" if s["valid"] else "invalid" for s in scores]
    out = {"method": "beam5", "n": len(test)}
    for kind in ("exact", "valid_wrong", "invalid"):
        idx = [i for i, k in enumerate(part) if k == kind]
        out[kind] = {"n": len(idx), "tanimoto": sum(scores[i]["tanimoto"] for i in idx) / len(idx) if idx else None,
                     "copy_tanimoto": sum(copy_scores[i]["tanimoto"] for i in idx) / len(idx) if idx else None}
    wrong = [k == "valid_wrong" for k in part]
    a, b = (rx.item_scores(n, sc, test)
            for n, sc in ((f"{CURVES[name]}, beam5", scores), ("copy_largest", copy_scores)))
    a["tanimoto"], b["tanimoto"] = ([v if w else None for v, w in zip(x["tanimoto"], wrong)] for x in (a, b))
    out["valid_wrong"]["comparison"] = rx.paired_comparison(a, b, "tanimoto", "test500, valid but wrong")
    return out


def size_comparisons(points, preds, test):
    """Each same-size point against the wide curve's point it matches (``same_size_marks``), beam 5, on the same
    test reactions: top-1 and Tanimoto (invalid = 0), paired item by item; each record names the point, its kind
    (equal steps / equal compute) and the wide point."""
    out = []
    for p in (x for x in points if x.get("matches")):
        a, b = (rx.item_scores(f"{name}, beam5", _scores([q[key]["beam"] for q in preds], test), test)
                for name, key in ((CURVES["same_size"], p["key"]), (CURVES["scale"], p["matches"])))
        out += [dict(rx.paired_comparison(a, b, m, "test500"), point=p["key"], kind=p["kind"], wide_point=p["matches"])
                for m in ("top1", "tanimoto")]
    return out


def rescore(payload):
    """Recompute, from the stored predictions, what the run derives from them: each curve's comparisons with
    copy and its outcome split, and the same-size curve against the wide one (no training, no decoding)."""
    r = payload["results"]
    preds = r.get("predictions")
    if not preds:
        return
    test = _test_rows(preds)
    copy_scores = _scores([reactions.copy_largest_reactant(t["reactants"], k=5) for t in test], test)
    for name in CURVES:
        if r.get(name) and f"{name}_final" in preds[0]:
            r[name]["comparisons"] = curve_comparisons(name, preds, test, copy_scores)
            r[name]["outcomes"] = outcomes(name, preds, test, copy_scores)
    if r.get("same_size") and "same_size_final" in preds[0]:
        r["same_size"]["against_scale"] = size_comparisons(r["same_size"]["points"], preds, test)


def calibration_study(run, cfg, rows, seed):
    """The plain nn.Transformer row: same data, width, depth, batch and schedule, calibration_minutes."""
    sc = dict(cfg["scale"], label_smoothing=0.0)
    sets, vocab, pairs, test_pairs = scale_data(rows, sc, seed)
    V = len(vocab)
    config = {k: sc[k] for k in ("d_model", "n_heads", "n_layers", "d_ff", "max_len")}
    module = plain_transformer(dict(config, src_vocab_size=V, tgt_vocab_size=V, src_pad_id=None), seed)
    folder = os.path.join(run.out_dir, "checkpoints", run.name)
    hist = train_for(module, pairs, sc, cfg["calibration_minutes"], os.path.join(folder, "calibration.pt"),
                     seed, "calibration", run.log)
    metrics, greedy, _ = score(module, vocab, sets["test"], test_pairs, with_beam=False)
    g = metrics["greedy"]
    run.log(f"calibration nn.Transformer: {hist['n_steps']} steps in {hist['wall_time'] / 60:.1f} min, greedy "
            f"top-1 {g['top1']:.3f}, valid {g['valid']:.3f}")
    return {"config": dict(config, batch_size=sc["batch_size"], lr=sc["lr"], warmup=sc["warmup"], dropout=0.1,
                           label_smoothing=0.0, norm_first=True),
            "params": sum(p.numel() for p in module.parameters()), "minutes": hist["wall_time"] / 60,
            "steps": hist["n_steps"], "epochs": hist["n_steps"] * sc["batch_size"] / len(pairs),
            "metrics": metrics}, greedy


# ----------------------------------------------------------------------------- main


def add_predictions(preds, test, curve, points, decodes):
    """Add one curve's decodes to the per-reaction predictions: per scored point <key> its greedy string and
    beam list, and the last one also as <curve>_final.  The test reactions must be the predictions' own, in
    order (report_kit.same_items)."""
    kit.same_items([p["row"] for p in preds], [r["row"] for r in test])
    last = points[-1]["key"] if points else None
    for i, p in enumerate(preds):
        for key, dec in decodes.items():
            p[key] = {"greedy": dec["greedy"][i], "beam": dec["beam"][i]}
        if last:
            p[f"{curve}_final"] = p[last]


def predictions(test, curves, results, calib_greedy):
    """Per test reaction: row, class, source, product, each curve's decodes (``add_predictions``; curves:
    {name: decodes}) and the calibration row's greedy string."""
    out = [{"row": r["row"], "class": r["class"], "source": r["reactants"], "product": r["product"]} for r in test]
    for name, decodes in curves.items():
        add_predictions(out, test, name, results[name]["points"], decodes)
    for p, g in zip(out, calib_greedy or []):
        p["calibration_greedy"] = g
    return out


def extended_stage(run, cfg, rows, seed, results):
    """(c): the wide curve, the calibration row, the same-size curve, their predictions and what is scored
    from them; returns the check on the predictions."""
    results["scale"], scale_dec, test = curve_study(run, cfg, rows, seed, "scale")
    results["calibration"], calib = calibration_study(run, cfg, rows, seed)
    results["same_size"], same_dec, _ = curve_study(run, cfg, rows, seed, "same_size", wide=results["scale"])
    results["predictions"] = predictions(test, {"scale": scale_dec, "same_size": same_dec}, results, calib)
    rescore({"results": results})
    return len(results["predictions"]) == len(test) and all(
        p[f"{c}_final"]["beam"] for p in results["predictions"] for c in CURVES)


ADDED_SAME_SIZE = ("the same-size curve (experiment 9's model size, the whole training split and the wide curve's "
                   "recipe, at equal steps and equal compute with a wide point) trained and scored; comparisons and "
                   "outcome splits recomputed from the stored predictions")
RESCORED = "comparisons and outcome splits recomputed from the stored predictions"


def add_same_size(run, cfg, seed):
    """--add-same-size: train and score the same-size curve into an existing extended results file (its
    other numbers are not rerun), then rescore; the call is recorded under the payload's ``updates``."""
    def update(payload):
        r, done = payload["results"], payload["config"]
        if not r.get("predictions") or "scale_final" not in r["predictions"][0]:
            raise ValueError(f"--add-same-size: {run.path} holds no scored wide curve (run --extended first)")
        ref = rx.FULL if not common.QUICK else dict(rx.FULL, **rx.QUICK_OVERRIDES)
        rows, _ = rx.load_reactions(ref)
        own = {k: cfg["same_size"][k] for k in MODEL_KEYS + BUDGET_KEYS}
        same = dict(cfg, scale=done["scale"], same_size=dict(done["scale"], **own))
        r["same_size"], decodes, test = curve_study(run, same, rows, seed, "same_size", wide=r["scale"])
        add_predictions(r["predictions"], test, "same_size", r["same_size"]["points"], decodes)
        done["same_size"] = same["same_size"]
        rescore(payload)
    common.update_results(run.path, ADDED_SAME_SIZE, update)


def extra_args(p):
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="(--extended) training minutes of each curve (default 60; QUICK: 0.03)")
    p.add_argument("--calibration-minutes", type=float, default=None,
                   help="(--extended) training minutes of the plain nn.Transformer row (default 13)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default 2; 1 is faster on a machine busy with other work)")
    p.add_argument("--add-same-size", action="store_true",
                   help="train and score only the same-size curve into the existing results file (in --out, or "
                        "the default folder), then rescore; recorded under the payload's 'updates'")
    p.add_argument("--same-size-kinds", default=None, choices=["steps", "compute", "steps,compute"],
                   help="which same-size points to train and score: equal steps, equal compute or both (default both)")
    p.add_argument("--rescore", action="store_true",
                   help="recompute the comparisons and outcome splits of the existing results file from its "
                        "stored predictions, without training or decoding; recorded under 'updates'")


def main():
    args, cfg, run = common.start("graduate_torch", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    for k in ("budget_minutes", "calibration_minutes", "threads"):
        if getattr(args, k) is not None:
            cfg[k] = run.config[k] = getattr(args, k)
    if args.workers is not None:
        cfg["workers"] = run.config["workers"] = args.workers
    if args.same_size_kinds:
        kinds = [f"equal {k}" for k in args.same_size_kinds.split(",")]
        cfg["same_size"] = run.config["same_size"] = dict(cfg["same_size"], kinds=kinds)
    torch, _ = torch_modules()
    torch.set_num_threads(cfg["threads"])
    if args.add_same_size or args.rescore:
        add_same_size(run, cfg, args.seed) if args.add_same_size else common.update_results(run.path, RESCORED, rescore)
        return run.log(f"updated {run.path}")
    n_stages = 4 if run.extended else 3
    run.stage(1, n_stages, "data (experiment 9's)")
    ref = rx.FULL if not common.QUICK else dict(rx.FULL, **rx.QUICK_OVERRIDES)
    rows, _ = rx.load_reactions(ref)
    sets = rx.select(rows, ref, args.seed)
    vocab = rx.build_vocab(sets["train"])
    train_pairs, valid_pairs = rx.encode(vocab, sets["train"]), rx.encode(vocab, sets["valid"])
    test_pairs = rx.encode(vocab, sets["test"])
    run.stage(2, n_stages, "(a) speed: pure Python against torch on the same batches")
    speeds, py_hist = speed(run, cfg, vocab, train_pairs, args.seed)
    run.stage(3, n_stages, "(b) the reference run with train_torch in float64")
    rep, ref_module = reproduce(run, cfg, vocab, train_pairs, valid_pairs, py_hist,
                                speeds["reference"]["pure_python_s_per_step"], args.seed)
    ref_beam = beam_check(ref_module, vocab, test_pairs, cfg)
    results = {"speed": speeds, "reproduce": rep, "beam_check": ref_beam, "torch_version": torch.__version__}
    checks = {"reference_loss_curve_within_1e-9": rep["max_abs_loss_diff_first_n"] <= 1e-9,
              "torch_beam_equals_our_beam_search_on_reference": ref_beam["same_top_beam"] == ref_beam["n"]}
    if run.extended:
        run.stage(4, n_stages, f"(c) two curves of {cfg['budget_minutes']:g} training minutes, the calibration")
        checks["predictions_for_every_test_reaction"] = extended_stage(run, cfg, rows, args.seed, results)
    results["checks"] = checks
    run.finish(results)


if __name__ == "__main__":
    main()
