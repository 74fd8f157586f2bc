"""Experiment 3 (the tutorial's section 10.3) - length extrapolation: which position scheme still works on
sequences longer (or shorter) than the ones it was trained on?

What it does
------------
For each position scheme pos = none / sine / learned / rope it trains one small decoder-only
TransformerLM (d = 32, 4 heads, 2 layers, d_ff = 64, ~18k parameters; Adam with linear warmup then
inverse-sqrt decay, clipping at 1.0, all through ``transformer.train``) on sequences of length 16
ONLY, then measures greedy next-token accuracy (teacher forcing: argmax of the logits at every
counted position) on fresh sequences of lengths 6 to 30.  The tasks (12 symbols, ids 0..11):

* ``periodic`` chain: the first 3 tokens are drawn uniformly, then every token repeats the token 3
  positions back (a b c a b c ...).  A length-L sample reads x_0..x_{L-1} and predicts x_1..x_L.
  SCORING RULE: the targets x_1 and x_2 cannot be predicted (they are fresh random draws), so the
  loss and the headline accuracy count only the targets x_3 .. x_L (L - 2 per sequence).  The
  tutorial's levels (0.826 at length 16 for a model that has solved the rule) are those of a rule
  that scores every token with 3 of every L unpredictable: (L - 3 + 3/12) / L = 0.828 at L = 16.
  We therefore also report ``accuracy_all_targets``: all L targets, the 2 unpredictable ones scored
  with the model's actual prediction (its ceiling is (L - 2 + 2/12) / L, ``ceiling_all_targets``).
  The rule is LOCAL: a model only has to look 3 positions back.  Evaluated at every length 6..30.
* ``mirror`` (the tutorial's exact task, the headline): s_1 .. s_n s_n .. s_1 with no separator,
  L = 2n tokens, symbols uniform.  The model reads all L tokens; only the n targets of the
  mirrored half count (the prediction made at s_n of the first half onwards; the last position has
  no target).  Where the mirrored half starts (and so the partner of every target) is fixed by the
  ABSOLUTE length: a model must count positions.  Evaluated at even lengths 6..30.
* ``mirror_sep`` (a second, labelled variant; ``--extended`` only): s_1..s_n SEP s_n..s_2, one extra
  separator token (id 12).  With the separator the partner of a target lies at a distance the model
  can read off relative to the separator, so the task no longer requires counting absolute positions
  and a relative scheme can in principle solve it at every length.

"Length" is the number of positions the model reads.  Training and evaluation count exactly the
same targets.  Every held-out set (validation, per-epoch checks, evaluation) comes from its own
seeded generator and never repeats a training sequence (the periodic chain has only 12^3 = 1728
distinct sequences, so a freshly drawn one would often be a training sequence).

Training budget and stopping rule (the same for every scheme and task, not tuned per scheme):
2 epochs over 1000 length-16 sequences at batch 8 = 250 Adam steps, peak lr 3e-3 after 150 warmup
steps.  After training a model is labelled ``converged`` if it solves the trained length
(held-out accuracy >= 0.99 at length 16) or its training loss has plateaued (mean loss of the last
50 steps within 5 % of the mean of the 50 steps before); otherwise it is reported as UNCONVERGED.
The learning curves (training loss per step, held-out loss per epoch) are in the results and figure.

Evaluation: ``n_eval_periodic`` = 200 length-30 sequences for the periodic task (the model is
causal, so the first L positions of a length-30 sequence ARE a length-L sample: one forward pass
gives every length; the script verifies this prefix property exactly) and ``n_eval_mirror`` = 60
sequences per length for the mirror tasks (the middle moves, so one set per length).  With
``transformer.parallel_map`` available the accuracy passes run in worker processes.

Honest treatment of the learned table: every model is built with max_len = 30.  Training only
touches rows 0..15; rows 16..29 get exactly zero gradient and Adam leaves them unchanged, so at test
time positions >= 16 read their random initial rows (std 0.02).  The script checks that they are
bit-identical to their initial values after training.

Modes: default = periodic + mirror, seed 0 (about a quarter of an hour on 2 cores).  ``--extended``
adds ``mirror_sep`` and seeds 1 and 2; every accuracy then also has mean and std over the seeds
(``accuracy_stats``).  QUICK=1: a smaller model trained for a few dozen steps (seconds; only the
pipeline and the sine-above-chance invariant mean anything).

How to read results_length_generalization.json (under "results")
------------------------------------------------------------
tasks.<task>.accuracy.<scheme>          list of {length, accuracy, n_sequences, n_targets} (seed = --seed)
tasks.periodic.accuracy_all_targets.<scheme>  same, every target counted (see the scoring rule)
tasks.<task>.accuracy_stats.<scheme>    (extended) list of {length, mean, std, n_seeds, values}
                                        (periodic: accuracy_all_targets_stats too)
tasks.<task>.per_seed.<seed>.<scheme>   (extended) accuracy rows of the other seeds
tasks.<task>.convergence.<scheme>       {converged, reason, last_loss, prev_loss, rel_change, solved}
tasks.periodic.position_accuracy.<scheme>  accuracy of the prediction made AT input position t
tasks.<task>.accuracy.<scheme>[i].accuracy_by_k  (mirror tasks) accuracy of the k-th mirrored target
tasks.<task>.curves.<scheme>            training loss every 5th step; epochs.<scheme>: per-epoch records
tasks.<task>.models.<scheme>            parameter count, steps, wall times, final losses
tasks.<task>.learned_table              the unseen-rows check; periodic.prefix_check_max_abs_diff
checks                                  self-checks that must all be True
Accuracy 1.0 is perfect, chance is 1/12 = 0.083.

Run:  python demos/demo_length_generalization.py [--extended]
      QUICK=1 python demos/demo_length_generalization.py
"""
import math
import os
import random
import statistics
import time

import common

core = common.core

N_SYMBOLS = 12          # symbol ids 0..11
SEP = N_SYMBOLS         # mirror_sep separator id 12
IGNORE = -100           # core.lm_loss ignore_index: targets that do not count
PERIOD = 3              # periodic chain: x[t] = x[t - 3]
SCHEMES = ("none", "sine", "learned", "rope")
TASKS = ("periodic", "mirror")
EXTENDED_TASKS = ("periodic", "mirror", "mirror_sep")
EXTENDED_SEEDS = (0, 1, 2)
KEY_LENGTHS = (6, 16, 20, 26, 30)   # the lengths quoted in progress lines and the report
CHECKPOINTS = []                    # training checkpoints of this run, deleted once the results are written
SOLVED_ACC = 0.99                   # stopping rule: "solves the trained length"
PLATEAU_WINDOW, PLATEAU_REL = 50, 0.05   # stopping rule: loss plateau over the last 2 x 50 steps

# FULL: 1000 length-16 training sequences x 2 epochs at batch 8 = 250 Adam steps per model, the same
# for every scheme and task (peak lr 3e-3 reached at step 150).
FULL = dict(train_length=16, min_length=6, max_length=30, n_train=1000, epochs=2, batch_size=8,
            lr=3e-3, warmup=150, clip=1.0, n_valid=32, n_epoch_acc=16,
            n_eval_periodic=200, n_eval_mirror=60, loss_every=5,
            model=dict(d_model=32, n_heads=4, n_layers=2, d_ff=64))
# QUICK: a smaller model, 30 steps with a short warmup: enough for the periodic rule to rise above
# chance, seconds per model; every other number means nothing.
QUICK_OVERRIDES = dict(n_train=480, epochs=1, warmup=10, lr=1e-2, n_valid=8, n_epoch_acc=4, n_eval_periodic=16,
                       n_eval_mirror=4, model=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32))


# ----------------------------------------------------------------------------- data


def periodic_sample(length, rng):
    """(inputs, targets) of a periodic chain read over ``length`` positions.

    Tokens x_0 .. x_length: x_0, x_1, x_2 uniform over the 12 symbols, x_t = x_{t-3} after that.
    inputs = x_0..x_{L-1}, targets = x_1..x_L; targets x_1, x_2 are unpredictable -> IGNORE.
    """
    head = [rng.randrange(N_SYMBOLS) for _ in range(PERIOD)]
    x = [head[t % PERIOD] for t in range(length + 1)]
    targets = [IGNORE if t + 1 < PERIOD else x[t + 1] for t in range(length)]
    return x[:length], targets


def mirror_sample(length, rng):
    """The tutorial's mirror task: s_1..s_n s_n..s_1 (n = length / 2, no separator), read in full.

    targets[t] = x[t+1] for the n mirrored tokens (t = n-1 .. 2n-2), IGNORE elsewhere (the first half
    is random, the last position has no next token).
    """
    if length % 2:
        raise ValueError(f"mirror lengths must be even, got {length}")
    n = length // 2
    s = [rng.randrange(N_SYMBOLS) for _ in range(n)]
    x = s + s[::-1]                                                  # (2n,)
    targets = [x[t + 1] if n - 1 <= t < 2 * n - 1 else IGNORE for t in range(length)]
    return x, targets


def mirror_sep_sample(length, rng):
    """Separator variant: s_1..s_n SEP s_n..s_1 (2n + 1 tokens); inputs are its first 2n tokens.
    Only the n mirrored targets (read from the SEP position on) count."""
    if length % 2:
        raise ValueError(f"mirror lengths must be even, got {length}")
    n = length // 2
    s = [rng.randrange(N_SYMBOLS) for _ in range(n)]
    full = s + [SEP] + s[::-1]
    targets = [IGNORE] * n + full[n + 1:]
    return full[:length], targets


SAMPLERS = {"periodic": periodic_sample, "mirror": mirror_sample, "mirror_sep": mirror_sep_sample}
DESCRIPTIONS = {
    "periodic": "x[t] = x[t-3], first 3 tokens random; counted targets x_3..x_L (all targets also reported)",
    "mirror": "the tutorial's task: s_1..s_n s_n..s_1, no separator, L = 2n; targets = the mirrored half",
    "mirror_sep": "variant: s_1..s_n SEP s_n..s_1 (separator id 12); targets = the mirrored half",
}


def make_set(task, length, n, seed, exclude=None, key_len=None):
    """``n`` samples of one task and length from their own seeded generator.

    With ``exclude`` (a set of input tuples of length ``key_len``), samples whose first ``key_len``
    inputs are in it are redrawn: held-out sets never repeat a training sequence.
    """
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        s = SAMPLERS[task](length, rng)
        if exclude is None or tuple(s[0][:key_len]) not in exclude:
            out.append(s)
    return out


def eval_lengths(task, cfg):
    lo, hi = cfg["min_length"], cfg["max_length"]
    return list(range(lo, hi + 1)) if task == "periodic" else list(range(lo + lo % 2, hi + 1, 2))


def vocab_size(task):
    return N_SYMBOLS + (1 if task == "mirror_sep" else 0)


# ----------------------------------------------------------------------------- measuring


def argmax_rows(logits):
    """Greedy choice per row (first index of the maximum, like core.generate's greedy pick)."""
    return [max(range(len(r)), key=r.__getitem__) for r in logits]


def hits(model, sample, all_targets=False):
    """[(t, correct)] at the counted positions of one sample, teacher forced.  With ``all_targets``
    (periodic only) the ignored targets count too, their true value being the next input token."""
    inputs, targets = sample
    pred = argmax_rows(model.forward(inputs))
    out = []
    for t, (p, y) in enumerate(zip(pred, targets)):
        if y == IGNORE and all_targets and t + 1 < len(inputs):
            y = inputs[t + 1]
        if y != IGNORE:
            out.append((t, p == y))
    return out


def map_samples(fn, samples):
    """fn(sample) over samples: in worker processes through core.parallel_map (results in input order,
    independent of the worker count); serially for a handful, where forking costs more than it saves."""
    if len(samples) > 8:
        return core.parallel_map(lambda s, rng: fn(s), samples)
    return [fn(s) for s in samples]


def accuracy(model, samples):
    """Fraction of counted targets predicted exactly (None if there are none)."""
    good = total = 0
    for h in map_samples(lambda s: hits(model, s), samples):
        good += sum(c for _, c in h)
        total += len(h)
    return good / total if total else None


def _per_length(good, count, lengths, n_seq):
    out = []
    for L in lengths:
        g, n = sum(good[:L]), sum(count[:L])
        out.append({"length": L, "accuracy": g / n if n else None, "n_sequences": n_seq, "n_targets": n})
    return out


def evaluate_periodic(model, samples, lengths):
    """Per-length accuracy (counted targets and all targets) and per-position accuracy, from one
    forward pass per max-length sequence."""
    T = len(samples[0][0])
    both = map_samples(lambda s: (hits(model, s), hits(model, s, all_targets=True)), samples)
    acc = {}
    for key, idx in (("counted", 0), ("all", 1)):
        good, count = [0] * T, [0] * T
        for h in both:
            for t, c in h[idx]:
                good[t] += c
                count[t] += 1
        acc[key] = (good, count)
    good, count = acc["counted"]
    per_pos = [{"position": t, "accuracy": good[t] / count[t]} for t in range(T) if count[t]]
    all_rows = _per_length(*acc["all"], lengths, len(samples))
    for row in all_rows:
        L = row["length"]
        row["ceiling"] = (L - (PERIOD - 1) + (PERIOD - 1) / N_SYMBOLS) / L
    return _per_length(good, count, lengths, len(samples)), all_rows, per_pos


def evaluate_mirror(model, sets):
    """Per-length accuracy (and by mirrored index k) on a separate set per length."""
    out = []
    for L, samples in sets:
        n = L // 2
        good_k = [0] * n
        for h in map_samples(lambda s: hits(model, s), samples):
            first = h[0][0]
            for t, c in h:
                good_k[t - first] += c
        total = n * len(samples)
        out.append({"length": L, "accuracy": sum(good_k) / total, "n_sequences": len(samples),
                    "n_targets": total, "accuracy_by_k": [g / len(samples) for g in good_k]})
    return out


def prefix_check(model, sample, lengths):
    """max |forward(x[:L]) - forward(x)[:L]| over the given L: 0 if causal masking is exact."""
    full = model.forward(sample[0])
    worst = 0.0
    for L in lengths:
        part = model.forward(sample[0][:L])
        worst = max(worst, max(abs(a - b) for ra, rb in zip(part, full[:L]) for a, b in zip(ra, rb)))
    return worst


def row_norm(r):
    return math.sqrt(core.dot(r, r))


def learned_table_check(before, after, train_length):
    """Did the rows never indexed in training keep their initial values, bit for bit?"""
    seen, unseen = range(train_length), range(train_length, len(after))
    changed_unseen = [i for i in unseen if after[i] != before[i]]
    return {
        "rows_total": len(after), "rows_seen_in_training": train_length,
        "unseen_rows_bit_identical": not changed_unseen, "unseen_rows_changed": changed_unseen,
        "max_abs_change_unseen": max((abs(a - b) for i in unseen for a, b in zip(after[i], before[i])),
                                     default=0.0),
        "seen_rows_changed": sum(after[i] != before[i] for i in seen),
        "mean_norm_seen_initial": sum(row_norm(before[i]) for i in seen) / len(seen),
        "mean_norm_seen_trained": sum(row_norm(after[i]) for i in seen) / len(seen),
        "mean_norm_unseen": sum(row_norm(after[i]) for i in unseen) / max(1, len(unseen)),
    }


def convergence(step_losses, valid_acc):
    """The stopping rule, applied after the fixed budget: solved (held-out accuracy at the trained
    length >= SOLVED_ACC) or plateaued (last PLATEAU_WINDOW steps' mean loss within PLATEAU_REL of
    the window before); otherwise unconverged."""
    w = PLATEAU_WINDOW
    last = statistics.fmean(step_losses[-w:])
    prev = statistics.fmean(step_losses[-2 * w:-w]) if len(step_losses) >= 2 * w else None
    rel = None if prev is None else (prev - last) / prev
    solved = valid_acc is not None and valid_acc >= SOLVED_ACC
    plateau = rel is not None and abs(rel) <= PLATEAU_REL
    reason = "solved" if solved else ("plateau" if plateau else "still improving at the budget")
    return {"converged": solved or plateau, "reason": reason, "solved": solved, "last_loss": last,
            "prev_loss": prev, "rel_change": rel, "window": w, "solved_threshold": SOLVED_ACC,
            "plateau_threshold": PLATEAU_REL}


# ----------------------------------------------------------------------------- one model


def train_one(task, pos, cfg, data, seed, args, run):
    """Build, train and evaluate one model; returns a dict of JSON-able records."""
    model = core.TransformerLM(vocab_size=vocab_size(task), max_len=cfg["max_length"], pos=pos, seed=seed,
                             **cfg["model"])
    table0 = [list(r) for r in model.embed.pe.W.data] if pos == "learned" else None
    Ltr, Lmax = cfg["train_length"], cfg["max_length"]

    def epoch_fn(m, epoch):
        return {f"valid_acc_{Ltr}": accuracy(m, data["epoch_acc_train_len"]),
                f"acc_{Lmax}": accuracy(m, data["epoch_acc_max_len"])}

    extra = {"checkpoint": run.checkpoint(f"{task}_{pos}_seed{seed}")}    # resumable: rerun to continue
    CHECKPOINTS.append(extra["checkpoint"])
    t0 = time.perf_counter()
    hist = core.train(model, data["train"], core.lm_loss, valid_data=data["valid"], epochs=cfg["epochs"],
                    batch_size=cfg["batch_size"], lr=cfg["lr"], warmup=cfg["warmup"], clip=cfg["clip"],
                    seed=seed, workers=args.workers, epoch_fn=epoch_fn, tag=f"{task}/{pos}/seed{seed}", **extra)
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec = {}
    if task == "periodic":
        rec["accuracy"], rec["accuracy_all_targets"], rec["position_accuracy"] = evaluate_periodic(
            model, data["eval"], eval_lengths(task, cfg))
        rec["prefix_check_max_abs_diff"] = prefix_check(model, data["eval"][0], [Ltr, Lmax - 1])
    else:
        rec["accuracy"] = evaluate_mirror(model, data["eval"])
    t_eval = time.perf_counter() - t0
    last = hist["epochs"][-1]
    rec["convergence"] = convergence([s["loss"] for s in hist["steps"]], last.get(f"valid_acc_{Ltr}"))
    rec["epochs"] = hist["epochs"]
    rec["curve"] = [{k: s[k] for k in ("step", "epoch", "loss", "lr", "grad_norm")} for s in hist["steps"]
                    if s["step"] % cfg["loss_every"] == 0 or s["step"] in (1, hist["n_steps"])]
    rec["model"] = {"vocab_size": vocab_size(task), "params": core.param_count(model),
                    "params_formula": core.param_count_formula(model), "n_steps": hist["n_steps"],
                    "train_settings": hist["settings"], "final_train_loss": last["train_loss"],
                    "final_valid_loss": last.get("valid_loss"),
                    "train_wall_s": round(t_train, 3), "eval_wall_s": round(t_eval, 3)}
    if table0 is not None:
        rec["learned_table"] = learned_table_check(table0, model.embed.pe.W.data, Ltr)
    return rec


def build_data(task, cfg, seed):
    """Train / valid / per-epoch check / evaluation sets; every set from its own seeded generator."""
    Ltr, Lmax = cfg["train_length"], cfg["max_length"]
    base = 1_000_003 * (seed + 1) + {"periodic": 0, "mirror": 500_000, "mirror_sep": 700_000}[task]
    train = make_set(task, Ltr, cfg["n_train"], base + 1)
    held = {"exclude": {tuple(s[0]) for s in train}, "key_len": Ltr}
    data = {
        "train": train,
        "valid": make_set(task, Ltr, cfg["n_valid"], base + 2, **held),
        "epoch_acc_max_len": make_set(task, Lmax, cfg["n_epoch_acc"], base + 3, **held),
    }
    data["epoch_acc_train_len"] = data["valid"]
    if task == "periodic":
        data["eval"] = make_set(task, Lmax, cfg["n_eval_periodic"], base + 4, **held)
    else:
        data["eval"] = [(L, make_set(task, L, cfg["n_eval_mirror"], base + 100 + L, **held))
                        for L in eval_lengths(task, cfg)]
    return data


def heldout_overlap(data, key_len):
    """Held-out samples (valid, per-epoch check, evaluation) whose first ``key_len`` inputs are a
    training sequence: 0 by construction (make_set redraws them); recorded as a check."""
    seen = {tuple(s[0]) for s in data["train"]}
    ev = data["eval"] if isinstance(data["eval"][0][0], list) else [s for _, ss in data["eval"] for s in ss]
    return sum(tuple(s[0][:key_len]) in seen for s in data["valid"] + data["epoch_acc_max_len"] + ev)


# ----------------------------------------------------------------------------- one task


def task_header(task, cfg, data):
    """The data settings of one task (seed = --seed)."""
    tr = {"description": DESCRIPTIONS[task], "vocab_size": vocab_size(task), "chance": 1.0 / N_SYMBOLS,
          "train_length": cfg["train_length"], "lengths": eval_lengths(task, cfg),
          "n_train": len(data["train"]), "n_train_distinct": len({tuple(s[0]) for s in data["train"]}),
          "n_valid": len(data["valid"]), "n_epoch_check_max_length": len(data["epoch_acc_max_len"]),
          "heldout_in_train_set": heldout_overlap(data, cfg["train_length"]),
          "accuracy": {}, "curves": {}, "epochs": {}, "models": {}, "convergence": {}}
    if task == "periodic":
        tr.update(n_eval_sequences=len(data["eval"]), scoring_rule="targets x_3..x_L (the first 2 targets "
                  "are unpredictable draws); accuracy_all_targets counts all L", accuracy_all_targets={},
                  position_accuracy={}, prefix_check_max_abs_diff={})
    else:
        tr["n_eval_sequences_per_length"] = cfg["n_eval_mirror"]
    return tr


def store(tr, pos, rec):
    """Copy one model's records into its task dict."""
    tr["accuracy"][pos] = rec["accuracy"]
    tr["curves"][pos] = rec["curve"]
    tr["epochs"][pos] = rec["epochs"]
    tr["models"][pos] = rec["model"]
    tr["convergence"][pos] = rec["convergence"]
    for key in ("accuracy_all_targets", "position_accuracy", "prefix_check_max_abs_diff"):
        if key in rec:
            tr[key][pos] = rec[key]
    if "learned_table" in rec:
        tr["learned_table"] = rec["learned_table"]


def run_task(task, seed, cfg, args, run, stage):
    """Train and evaluate the four schemes on one task and seed; returns the task dict."""
    data = build_data(task, cfg, seed)
    tr = task_header(task, cfg, data)
    for pos in SCHEMES:
        stage(f"{task} / pos={pos} / seed {seed}")
        rec = train_one(task, pos, cfg, data, seed, args, run)
        store(tr, pos, rec)
        key = [a for a in rec["accuracy"] if a["length"] in KEY_LENGTHS]
        cv = rec["convergence"]
        run.log(f"{task} / {pos} / seed {seed}: accuracy " + ", ".join(f"L={a['length']} {a['accuracy']:.3f}"
                                                                       for a in key)
                + f"; {'converged' if cv['converged'] else 'UNCONVERGED'} ({cv['reason']}); train "
                  f"{common.fmt_time(rec['model']['train_wall_s'])}, "
                  f"eval {common.fmt_time(rec['model']['eval_wall_s'])}")
    return tr


# ----------------------------------------------------------------------------- summary


def seed_stats(per_seed):
    """{scheme: [{length, mean, std, n_seeds, values}]} from {seed: {scheme: accuracy rows}}."""
    seeds = sorted(per_seed)
    out = {}
    for pos in per_seed[seeds[0]]:
        rows = []
        for i, row in enumerate(per_seed[seeds[0]][pos]):
            vals = [per_seed[s][pos][i]["accuracy"] for s in seeds]
            rows.append({"length": row["length"], "mean": statistics.fmean(vals),
                         "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n_seeds": len(vals),
                         "values": vals})
        out[pos] = rows
    return out


def self_checks(tasks):
    """Booleans that must all be True (tests read them)."""
    return {
        "learned_unseen_rows_bit_identical": all(tr["learned_table"]["unseen_rows_bit_identical"]
                                                 for tr in tasks.values()),
        "periodic_prefix_evaluation_exact": all(v == 0.0
                                                for v in tasks["periodic"]["prefix_check_max_abs_diff"].values()),
        "heldout_disjoint_from_train": all(tr["heldout_in_train_set"] == 0 for tr in tasks.values()),
        "param_count_matches_formula": all(m["params"] == m["params_formula"]
                                           for tr in tasks.values() for m in tr["models"].values()),
        "all_targets_consistent_with_counted": all(_all_vs_counted(tasks["periodic"], pos)
                                                   for pos in tasks["periodic"]["accuracy"]),
    }


def _all_vs_counted(tr, pos):
    """All-targets hits = counted hits + hits on the unpredictable targets, so
    counted_hits <= all_hits <= counted_hits + (n_all - n_counted) at every length."""
    for c, a in zip(tr["accuracy"][pos], tr["accuracy_all_targets"][pos]):
        hc, ha = c["accuracy"] * c["n_targets"], a["accuracy"] * a["n_targets"]
        if not (hc - 1e-6 <= ha <= hc + (a["n_targets"] - c["n_targets"]) + 1e-6):
            return False
    return True


def main():
    args, cfg, run = common.start("length_generalization", __doc__, FULL, QUICK_OVERRIDES)
    tasks = EXTENDED_TASKS if run.extended else TASKS
    seeds = [args.seed] + [s for s in EXTENDED_SEEDS if s != args.seed] if run.extended else [args.seed]
    run.config.update(schemes=list(SCHEMES), tasks=list(tasks), seeds=seeds, n_symbols=N_SYMBOLS,
                      separator_id=SEP, period=PERIOD, ignore_index=IGNORE, workers=args.workers,
                      stopping_rule={"solved_acc": SOLVED_ACC, "plateau_window": PLATEAU_WINDOW,
                                     "plateau_rel": PLATEAU_REL})
    n_stages, done = len(tasks) * len(SCHEMES) * len(seeds), [0]

    def stage(what):
        done[0] += 1
        run.stage(done[0], n_stages, what)

    results = {"chance": 1.0 / N_SYMBOLS, "schemes": list(SCHEMES), "key_lengths": list(KEY_LENGTHS),
               "train_length": cfg["train_length"], "seeds": seeds, "tasks": {}}
    for seed in seeds:
        for task in tasks:
            tr = run_task(task, seed, cfg, args, run, stage)
            if seed == seeds[0]:
                results["tasks"][task] = tr
            else:
                results["tasks"][task].setdefault("per_seed", {})[str(seed)] = {
                    "accuracy": tr["accuracy"], "convergence": tr["convergence"],
                    **({"accuracy_all_targets": tr["accuracy_all_targets"]} if task == "periodic" else {})}
    if len(seeds) > 1:
        for task, tr in results["tasks"].items():
            for key in ("accuracy", "accuracy_all_targets"):
                if key in tr:
                    per = {str(seeds[0]): tr[key], **{s: v[key] for s, v in tr["per_seed"].items()}}
                    tr[f"{key}_stats"] = seed_stats(per)
    results["checks"] = self_checks(results["tasks"])
    run.log("checks: " + ", ".join(f"{k} {v}" for k, v in results["checks"].items()))
    run.finish(results)
    for path in CHECKPOINTS:            # a finished run keeps no checkpoint (a rerun trains afresh)
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
