"""Shared pieces of the three property-prediction demos (experiments 6, 7, 8: ESOL, materials, HOPV).

A demo builds its splits and baselines; this module does the parts they have in common:

* ``encode`` - token lists -> id lists with <bos>/<eos>, truncated to a maximum length (counted);
* ``train_encoder`` - a ``TransformerEncoder`` (mean pooling, one regression output) trained with
  ``transformer.train`` + ``regression_loss`` on the z-scored target, predictions for every split back
  in the target's units, per-epoch learning curve (train / valid RMSE in the target's units);
* ``metrics`` / ``split_metrics`` - RMSE, MAE, R^2, Pearson;
* ``run_record`` - the ``results.runs[*]`` record {split, model, seed, metrics, test_ids, y_true, y_pred};
* ``summarize`` - mean and std over seeds of every (split, model) pair;
* ``comparison`` / ``compare_models`` - a ``results.comparisons`` record: paired bootstrap over the same test
  items (seeds pooled) plus the seed-spread rule -> verdict lower / higher / level;
* ``best_epoch`` / ``EpochSnapshots`` - the epoch early stopping keeps, and that epoch's weights back;
* ``save_predictor`` - the model file ``predictor.load_predictor`` reads (weights + meta: tokenizer,
  vocabulary, target scaling, units, task, training-data sha256, SMILES preparation, domain reference);
* ``domain_threshold`` / ``applicability_domain`` - the domain's similarity threshold chosen on the validation
  split and stored in the model file (and the error in vs out of domain of given predictions);
  ``saved_predictor.py`` builds the property studies' model files on these;
* ``deepchem_mlp`` - DeepChem's ``MultitaskRegressor`` on fingerprints, or a recorded reason why not.
"""
import hashlib
import json
import math
import os
import statistics
import time

import common

import chemdata
import evaluation
import predictor
import safe_io

core = common.core


# ----------------------------------------------------------------------------- tokens


def encode(token_lists, vocab, max_tokens=None):
    """Id lists (<bos> tokens <eos>) and the number of inputs cut to ``max_tokens`` ids in total.

    Truncation keeps the first ``max_tokens - 1`` ids and puts <eos> last, so every input still ends
    with <eos>; ``predictor.Predictor`` applies the same rule at prediction time."""
    out, n_cut = [], 0
    for tokens in token_lists:
        ids = vocab.encode(tokens)
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[:max_tokens - 1] + [vocab.eos_id]
            n_cut += 1
        out.append(ids)
    return out, n_cut


def length_stats(token_lists):
    """Token-length distribution (without <bos>/<eos>): mean, median, P95, max, histogram in 10s."""
    n = sorted(len(t) for t in token_lists)
    hist = {}
    for v in n:
        hist[10 * (v // 10)] = hist.get(10 * (v // 10), 0) + 1
    return {"mean": sum(n) / len(n), "median": n[len(n) // 2], "p95": n[min(len(n) - 1, int(0.95 * len(n)))],
            "max": n[-1], "min": n[0], "histogram_bin10": {str(k): v for k, v in sorted(hist.items())}}


def data_sha256(items, ys):
    """sha256 of the training data (inputs and targets, in order): identifies what a model saw."""
    h = hashlib.sha256()
    for x, y in zip(items, ys):
        h.update(f"{x}\t{float(y)!r}\n".encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- metrics and records


def metrics(y_true, y_pred):
    """RMSE, MAE, R^2 and Pearson (None when a side is constant) in the target's units."""
    constant = max(y_pred) == min(y_pred)          # the mean baseline: no correlation to speak of
    return {"rmse": evaluation.rmse(y_true, y_pred), "mae": evaluation.mae(y_true, y_pred),
            "r2": evaluation.r2(y_true, y_pred), "pearson": None if constant else evaluation.pearson(y_true, y_pred),
            "n": len(y_true)}


def split_metrics(y, preds):
    """{part: metrics} for the parts ('train', 'valid', 'test') present in both dicts."""
    return {part: metrics(y[part], preds[part]) for part in ("train", "valid", "test") if part in preds}


def run_record(split, model, seed, y, preds, test_ids, **extra):
    """One ``results.runs[*]`` record; the test predictions are stored so every metric can be recomputed."""
    rec = {"split": split, "model": model, "seed": seed, "metrics": split_metrics(y, preds),
           "test_ids": list(test_ids), "y_true": list(y["test"]), "y_pred": [float(v) for v in preds["test"]]}
    rec.update(extra)
    return rec


def summarize(runs):
    """Mean, std and range (max - min: ``evaluation.seed_spread``) over seeds of the train/valid/test RMSE,
    MAE, R^2 and Pearson of every (split, model) pair, in the order the pairs first appear."""
    groups = {}
    for r in runs:
        groups.setdefault((r["split"], r["model"]), []).append(r)
    out = []
    for (split, model), rs in groups.items():
        row = {"split": split, "model": model, "n_seeds": len(rs), "seeds": [r["seed"] for r in rs]}
        for part in ("train", "valid", "test"):
            for key in ("rmse", "mae", "r2", "pearson"):
                vals = [r["metrics"][part][key] for r in rs if part in r["metrics"]
                        and r["metrics"][part].get(key) is not None]
                if vals:
                    row[f"{part}_{key}"] = statistics.fmean(vals)
                    row[f"{part}_{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
                    row[f"{part}_{key}_range"] = evaluation.seed_spread(vals)
        for key in ("train_time_s", "predict_time_s"):
            vals = [r[key] for r in rs if key in r]
            if vals:
                row[key] = statistics.fmean(vals)
        out.append(row)
    return out


def check_records(runs, sizes):
    """Self-checks on the records: lengths equal the split sizes, stored metrics recompute exactly."""
    ok_len = all(len(r["y_true"]) == len(r["y_pred"]) == len(r["test_ids"]) == sizes[r["split"]]
                 for r in runs)
    ok_metrics = all(abs(metrics(r["y_true"], r["y_pred"])["rmse"] - r["metrics"]["test"]["rmse"]) < 1e-9
                     for r in runs)
    return {"record_lengths_equal_split_sizes": ok_len, "stored_metrics_recompute": ok_metrics}


# ----------------------------------------------------------------------------- paired comparisons


RESCORED = "summary, comparisons and checks recomputed from the stored predictions (nothing trained)"


def rescore_arg(p):
    """The property demos' ``--rescore`` flag (each demo's ``rescore(payload)`` does the work)."""
    p.add_argument("--rescore", action="store_true",
                   help="recompute the summary, comparisons and checks of the existing results file (in --out, or "
                        "the default folder) from its stored predictions, without training; recorded under "
                        "'updates'")


def seed_spread_level(gap, spread, n_seeds):
    """The seed-spread rule (as report_property's ``compare_rows``): with more than one seed on a side, a gap
    no larger than ``evaluation.seed_spread`` of the two sides (the larger max - min) is no gap."""
    return max(n_seeds) > 1 and abs(gap) <= spread


def _check_same_items(runs):
    """Every run must name the same test items in the same order (and, with y_true, the same targets)."""
    ids, ys = runs[0]["test_ids"], runs[0].get("y_true")
    for r in runs[1:]:
        if r["test_ids"] != ids:
            raise ValueError(f"comparison: run {r['model']!r} seed {r['seed']} names other test items "
                             f"(or another order) than {runs[0]['model']!r} seed {runs[0]['seed']}")
        if ys is not None and r.get("y_true") != ys:
            raise ValueError(f"comparison: run {r['model']!r} seed {r['seed']} has other test targets")


def _paired_seeds(a_runs, b_runs):
    """[(a run, b run)]: the same seeds paired, or a single run on one side paired with every seed of the other."""
    if len(a_runs) == 1 or len(b_runs) == 1:
        return [(a, b) for a in a_runs for b in b_runs]
    by_seed = {r["seed"]: r for r in b_runs}
    if sorted(by_seed) != sorted(r["seed"] for r in a_runs):
        raise ValueError(f"comparison: seeds {[r['seed'] for r in a_runs]} and {sorted(by_seed)} do not pair")
    return [(a, by_seed[a["seed"]]) for a in a_runs]


def comparison(a_runs, b_runs, metric, split, values="y_pred", n_resamples=2000, seed=0):
    """One ``results.comparisons`` record: model A against model B on the same test items of ``split``.

    ``a_runs`` / ``b_runs``: the run records (one per seed) of each model; ``values``: the key of each
    record's per-item list (predictions against ``y_true`` for 'rmse' / 'mae', per-item scores for
    'mean'; the record's ``metric`` is then that key).  ``diff`` and its 95 % interval come from
    ``evaluation.paired_bootstrap`` with the seeds pooled (items drawn with every seed's prediction);
    ``verdict`` is 'lower' / 'higher' only when BOTH the
    seed-spread rule (mean over seeds of each seed's metric, gap beyond ``evaluation.seed_spread``: the
    larger max - min of the two sides) and the interval excluding zero agree, else 'level'."""
    if not a_runs or not b_runs:
        raise ValueError(f"comparison on {split!r}: no runs for {'A' if not a_runs else 'B'}")
    _check_same_items(list(a_runs) + list(b_runs))
    pairs = _paired_seeds(a_runs, b_runs)
    n = len(a_runs[0]["test_ids"])
    y = None if metric == "mean" else [v for _ in pairs for v in a_runs[0]["y_true"]]
    boot = evaluation.paired_bootstrap(y, [v for a, _ in pairs for v in a[values]],
                                       [v for _, b in pairs for v in b[values]], metric=metric,
                                       n_resamples=n_resamples, seed=seed, groups=list(range(n)) * len(pairs))
    per_seed = [[_metric_of(r, values, metric) for r in runs] for runs in (a_runs, b_runs)]
    spread = evaluation.seed_spread(*per_seed)
    gap = statistics.fmean(per_seed[0]) - statistics.fmean(per_seed[1])
    level = seed_spread_level(gap, spread, (len(a_runs), len(b_runs)))
    ci_side = "lower" if boot["ci_high"] < 0 else "higher" if boot["ci_low"] > 0 else "level"
    verdict = "level" if level else ci_side
    return {"a": a_runs[0]["model"], "b": b_runs[0]["model"], "metric": values if metric == "mean" else metric,
            "split": split,
            "diff": boot["diff"], "ci_low": boot["ci_low"], "ci_high": boot["ci_high"], "n_items": n,
            "n_resamples": n_resamples, "n_seeds_a": len(a_runs), "n_seeds_b": len(b_runs),
            "mean_gap_over_seeds": gap, "seed_spread": spread, "seed_spread_rule_level": level,
            "ci_verdict": ci_side, "verdict": verdict}


def _metric_of(run, values, metric):
    """One run's metric on its full test set: RMSE or MAE against y_true, or the mean of the non-None scores."""
    if metric == "mean":
        vals = [v for v in run[values] if v is not None]
        return sum(vals) / len(vals)
    return (evaluation.rmse if metric == "rmse" else evaluation.mae)(run["y_true"], run[values])


def compare_models(runs, split, a, b, metric="rmse", **kw):
    """``comparison`` of the models named ``a`` and ``b`` among ``runs`` on ``split`` (None when either is absent)."""
    def pick_runs(m):
        return [r for r in runs if r["split"] == split and r["model"] == m]
    ra, rb = pick_runs(a), pick_runs(b)
    return comparison(ra, rb, metric, split, **kw) if ra and rb else None


def per_seed_comparisons(runs, split, a, b, metric="rmse", n_resamples=2000, seed=0):
    """Model ``a`` against model ``b`` WITHIN each seed: for every seed both ran on ``split``, a paired bootstrap
    of metric(a) - metric(b) over that seed's test items (the two rows of one training, e.g. its best and its
    last epoch, share the seed, so the seed-to-seed spread says nothing about their gap).  Verdict per seed:
    'lower' / 'higher' when the 95 % interval excludes 0, else 'level' ('same' when the two predictions are
    identical).  Returns [{a, b, metric, split, seed, diff, ci_low, ci_high, n_items, verdict, rule}]."""
    out = []
    by_seed = {r["seed"]: r for r in runs if r["split"] == split and r["model"] == b}
    for ra in (r for r in runs if r["split"] == split and r["model"] == a and r["seed"] in by_seed):
        rb = by_seed[ra["seed"]]
        _check_same_items([ra, rb])
        boot = evaluation.paired_bootstrap(ra["y_true"], ra["y_pred"], rb["y_pred"], metric=metric,
                                           n_resamples=n_resamples, seed=seed)
        verdict = ("same" if ra["y_pred"] == rb["y_pred"] else "lower" if boot["ci_high"] < 0
                   else "higher" if boot["ci_low"] > 0 else "level")
        out.append({"a": a, "b": b, "metric": metric, "split": split, "seed": ra["seed"], "diff": boot["diff"],
                    "ci_low": boot["ci_low"], "ci_high": boot["ci_high"], "n_items": boot["n_items"],
                    "n_resamples": n_resamples, "verdict": verdict,
                    "rule": "paired bootstrap within the seed; 'lower'/'higher' when the 95 % interval excludes 0"})
    return out


def subset_runs(runs, keep):
    """The run records restricted to the test items whose id is in ``keep`` (a set), metrics recomputed on
    them: the same models on a subset of the same items (e.g. test formulas never seen in training)."""
    out = []
    for r in runs:
        ix = [i for i, t in enumerate(r["test_ids"]) if t in keep]
        y, p = [r["y_true"][i] for i in ix], [r["y_pred"][i] for i in ix]
        out.append(dict(r, test_ids=[r["test_ids"][i] for i in ix], y_true=y, y_pred=p,
                        metrics=dict(r["metrics"], test=metrics(y, p)) if ix else r["metrics"]))
    return out


# ----------------------------------------------------------------------------- model selection


def best_epoch(curve, patience=None, key="valid_rmse"):
    """The epoch early stopping keeps: the lowest ``key`` (valid RMSE) seen before ``patience`` epochs in a
    row fail to improve on it (patience None: over the whole curve).  ``curve``: [{epoch, valid_rmse, ...}]
    as ``learning_curve`` gives.  Returns {epoch, value, stopped_at (the last epoch early stopping would
    have trained), patience}.  Ties keep the earlier epoch."""
    if not curve or any(key not in e for e in curve):
        raise ValueError(f"best_epoch: every epoch record needs {key!r} (got {len(curve)} records)")
    if patience is not None and (not isinstance(patience, int) or patience < 1):
        raise ValueError(f"best_epoch: patience must be a positive int or None, got {patience!r}")
    best, since, stopped = curve[0], 0, curve[-1]["epoch"]
    for e in curve[1:]:
        if e[key] < best[key]:
            best, since = e, 0
        else:
            since += 1
            if patience is not None and since >= patience:
                stopped = e["epoch"]
                break
    return {"epoch": best["epoch"], "value": best[key], "stopped_at": stopped, "patience": patience}


class EpochSnapshots:
    """``epoch_fn`` for ``transformer.train`` that copies every Param's values at the end of each epoch, so
    the epoch ``best_epoch`` picks can be put back with ``restore(model, epoch)`` (no second training loop).

    ``path``: the snapshots are also written there (atomically, after every epoch), and a training that
    resumes from its checkpoint (``resume=True``) reads back the epochs an earlier call finished, so
    model selection survives an interruption.  ``resume=False`` (a training starting afresh) ignores
    and then overwrites what the file holds.  Without a file, an epoch finished before a resumed call has
    no snapshot: ``restore`` then returns False."""

    def __init__(self, path=None, resume=False):
        self.path, self.snaps = path, {}
        if path and resume and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.snaps = {int(k): v for k, v in json.load(f).items()}

    def __call__(self, model, epoch):
        self.snaps[epoch] = [[list(row) for row in p.rows()] for p in model.params()]
        if self.path:
            safe_io.atomic_write(self.path, json.dumps(self.snaps, allow_nan=False, separators=(",", ":")))
        return {}

    def restore(self, model, epoch):
        """Copy epoch ``epoch``'s values back into the model's Params in place; False if there is none."""
        snap = self.snaps.get(epoch)
        if snap is None:
            return False
        for p, rows in zip(model.params(), snap):
            for live, saved in zip(p.rows(), rows):
                live[:] = saved
        return True


# ----------------------------------------------------------------------------- Transformer


def predict_z(model, id_lists):
    """Model outputs (z units) for many inputs; forked workers through ``core.parallel_map`` (results in input
    order) for more than a handful, one process below that (forking costs more than it saves)."""
    if len(id_lists) > 64:
        return core.parallel_map(lambda ids, rng: model.forward(ids)[0], id_lists)
    return [model.forward(ids)[0] for ids in id_lists]


def train_encoder(ids, y, cfg, *, seed, tag, vocab_size, pad_id, checkpoint=None, workers=None, log=print,
                  token_features=None, keep_best=False, patience=None):
    """Train one TransformerEncoder on the z-scored target and predict every split.

    ``ids`` / ``y``: {part: list} for 'train', 'valid', 'test' (y in the target's units).  ``cfg`` holds
    d_model, n_heads, n_layers, d_ff (optional), max_len, epochs or max_steps, batch_size, lr, warmup.
    ``token_features``: optional fixed per-id features added through a learned projection (periodic-table
    priors).  Returns {model, scaler, preds (units), history, curve, train_time_s, predict_time_s, n_params}.
    ``keep_best``: also the epoch ``best_epoch(curve, patience)`` picks (every epoch's weights are copied by
    ``EpochSnapshots``): ``best`` = {epoch, value, stopped_at, patience, restored, preds}, and ``model`` then
    holds that epoch's weights (``preds`` stay the last epoch's)."""
    scaler = evaluation.ZScore().fit(y["train"])
    model = core.TransformerEncoder(vocab_size, d_model=cfg["d_model"], n_heads=cfg["n_heads"],
                                  n_layers=cfg["n_layers"], d_ff=cfg.get("d_ff"), max_len=cfg["max_len"],
                                  pad_id=pad_id, pos=cfg.get("pos", "sine"), seed=seed,
                                  token_features=token_features)
    train_data = list(zip(ids["train"], scaler.transform(y["train"])))
    valid_data = list(zip(ids["valid"], scaler.transform(y["valid"])))
    kw = dict(valid_data=valid_data, epochs=cfg["epochs"], batch_size=cfg["batch_size"], lr=cfg["lr"],
              warmup=cfg["warmup"], clip=cfg.get("clip", 1.0), seed=seed, workers=workers,
              max_steps=cfg.get("max_steps"), tag=tag, checkpoint=checkpoint)
    snaps = None
    if keep_best:                                  # beside the checkpoint, resumed with it
        snaps = EpochSnapshots(os.path.splitext(checkpoint)[0] + ".epochs.json" if checkpoint else None,
                               resume=bool(checkpoint) and os.path.exists(checkpoint))
    history = core.train(model, train_data, core.regression_loss, epoch_fn=snaps, **kw)
    train_time = history["wall_time"]      # summed over every call of a run resumed from its checkpoint
    t0 = time.perf_counter()
    preds = {part: scaler.inverse(predict_z(model, ids[part])) for part in ("train", "valid", "test")}
    predict_time = time.perf_counter() - t0
    log(f"{tag}: trained in {common.fmt_time(train_time)}, predicted {sum(map(len, ids.values()))} inputs "
        f"in {common.fmt_time(predict_time)}")
    out = {"model": model, "scaler": scaler, "preds": preds, "history": history,
           "curve": learning_curve(history, scaler.std), "train_time_s": train_time,
           "predict_time_s": predict_time, "n_params": core.param_count(model)}
    if keep_best:
        out["best"] = restore_best(model, snaps, out["curve"], patience, scaler, ids, log=log, tag=tag)
    return out


def restore_best(model, snaps, curve, patience, scaler, ids, log=print, tag=""):
    """Put the weights of the epoch early stopping keeps back into ``model`` and predict every split with
    them: {epoch, value, stopped_at, patience, restored, preds}.  Without its snapshot (an epoch trained
    before a resumed call) the last epoch's weights stay and ``restored`` is False."""
    best = best_epoch(curve, patience)
    last = curve[-1]["epoch"]
    best["restored"] = best["epoch"] == last or snaps.restore(model, best["epoch"])
    if not best["restored"]:
        best.update(epoch=last, value=curve[-1]["valid_rmse"])
    best["preds"] = {part: scaler.inverse(predict_z(model, ids[part])) for part in ("train", "valid", "test")}
    log(f"{tag}: best validation epoch {best['epoch']} of {last} (valid RMSE {best['value']:.3f}, patience "
        f"{patience}, restored {best['restored']})")
    return best


def learning_curve(history, std):
    """Per-epoch train and valid RMSE in the target's units (sqrt of the mean z-MSE times the std)."""
    out = []
    for e in history["epochs"]:
        rec = {"epoch": e["epoch"], "steps": e["steps"], "elapsed": e["elapsed"],
               "train_rmse": math.sqrt(max(0.0, e["train_loss"])) * std}
        if "valid_loss" in e:
            rec["valid_rmse"] = math.sqrt(max(0.0, e["valid_loss"])) * std
        out.append(rec)
    return out


def save_predictor(model, path, *, tokenizer, vocab, scaler, units, task, train_items, train_y,
                   max_tokens=None, extra=None):
    """Write the self-contained model file ``predictor.load_predictor`` reads (atomic).

    Besides the weights, tokenizer, vocabulary, target scaling, units and task, the meta records how the
    training SMILES were prepared (``smiles_preparation``: canonical or not, stereo marks present; needs
    RDKit) and the training reference of the applicability domain (``domain``: token-length range and the
    distinct training fingerprints or formulas; its similarity threshold is set by ``applicability_domain``)."""
    meta = {"kind": "chemdata.Predictor", "tokenizer": tokenizer, "vocab_tokens": vocab.tokens,
            "vocab_specials": list(vocab.SPECIALS), "target_mean": scaler.mean, "target_std": scaler.std,
            "units": units, "task": task, "max_tokens": max_tokens, "n_train": len(train_items),
            "train_data_sha256": data_sha256(train_items, train_y),
            "domain": predictor.domain_reference(tokenizer, train_items)}
    if tokenizer == "smiles_atom" and chemdata.rdkit_available():
        meta["smiles_preparation"] = predictor.smiles_preparation_record(train_items)
    meta.update(extra or {})
    core.save_model(model, path, meta)
    return meta


def _domain_errors(saved, items, y_true, y_pred):
    """{n_in, n_out, n_not_checked, rmse_in, rmse_out, mae_in, mae_out, out_reasons} of one split."""
    groups, reasons = {"in": [], "out": [], "not checked": []}, {}
    for x, t, p in zip(items, y_true, y_pred):
        try:
            domain, why, _ = saved.domain_of(x)
        except ValueError as e:
            domain, why = "not checked", [str(e)]
        groups[domain].append((t, p))
        for w in why if domain == "out" else []:
            key = "unseen tokens" if "unseen" in w else "length" if "training range" in w else "similarity"
            reasons[key] = reasons.get(key, 0) + 1
    out = {"n_in": len(groups["in"]), "n_out": len(groups["out"]), "n_not_checked": len(groups["not checked"])}
    for name in ("in", "out"):
        pairs = groups[name]
        out[f"rmse_{name}"] = evaluation.rmse(*zip(*pairs)) if pairs else None
        out[f"mae_{name}"] = evaluation.mae(*zip(*pairs)) if pairs else None
    out["out_reasons"] = reasons
    return out


def domain_threshold(path, valid_items, coverage=predictor.DOMAIN_COVERAGE):
    """Choose the similarity threshold of a saved predictor on the validation inputs and store it in the model
    file (atomically): ``predictor.domain_threshold`` of their nearest-training-neighbour similarities through
    the predictor (the least similar ``1 - coverage`` fall below it).  Returns {threshold, rule}, or
    {threshold: None, rule: None, skipped} for a file without a training reference."""
    saved = predictor.load_predictor(path)
    if saved.reference is None:
        return {"threshold": None, "rule": None, "skipped": predictor.NO_REFERENCE}
    sims = []
    for x in valid_items:
        try:
            sims.append(saved.domain_of(x)[2])
        except ValueError:                       # cannot be prepared: no similarity
            sims.append(None)
    threshold = predictor.domain_threshold(sims, coverage)
    rule = (f"nearest-training-neighbour similarity ({saved.reference['kind']}) below which the least "
            f"similar {1 - coverage:.0%} of the {sum(s is not None for s in sims)} validation inputs fall, "
            "rounded down to 0.01")
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    obj["meta"]["domain"].update(threshold=threshold, threshold_rule=rule, coverage=coverage)
    safe_io.atomic_write(path, json.dumps(obj, allow_nan=False, separators=(",", ":")))
    return {"threshold": threshold, "rule": rule}


def applicability_domain(path, items, y, split_idx, preds, coverage=predictor.DOMAIN_COVERAGE):
    """``domain_threshold`` on the validation split, then the error in and out of domain of ``preds``
    ({'valid': [...], 'test': [...]} in the target's units) on the validation and test splits.

    ``items`` / ``y``: every input (as the model was trained on them) and target; ``split_idx``: the
    (train, valid, test) indices.  Returns {threshold, rule, valid: {...}, test: {...}} with n, RMSE and MAE
    in and out of domain (the test split chose nothing)."""
    valid = (pick(items, split_idx[1]), pick(y, split_idx[1]), preds["valid"])
    test = (pick(items, split_idx[2]), pick(y, split_idx[2]), preds["test"])
    out = domain_threshold(path, valid[0], coverage)
    if out["threshold"] is None:
        return out
    saved = predictor.load_predictor(path)
    return dict(out, valid=_domain_errors(saved, *valid), test=_domain_errors(saved, *test))


# ----------------------------------------------------------------------------- DeepChem MLP


def deepchem_available():
    """(True, version) or (False, reason): DeepChem cannot be installed on Python >= 3.12, for instance."""
    try:
        return True, chemdata.import_deepchem().__version__     # without its import-time log lines
    except Exception as e:       # ImportError, or a broken backend raising something else
        return False, f"deepchem not importable: {type(e).__name__}: {e}"


MOLNET_FILES = {"load_delaney": "delaney-processed.csv", "load_hopv": "hopv.csv"}


def deepchem_molnet(loader):
    """(available, info, tasks, dataset): DeepChem's MoleculeNet ``loader`` ('load_delaney', 'load_hopv')
    with ECFP features, unsplit and untransformed, reading the file from the data folder chemdata uses
    (``$CHEMDATA_DIR`` or data/) so that DeepChem never downloads it; its featurised cache goes to
    ``chemdata.deepchem_cache_dir`` (deepchem_save/<first 12 hex digits of the file's sha256>/ in that same
    data folder, never the checkout when the data live elsewhere).
    When DeepChem is missing, the file is not there, or the loader fails (no network, a DeepChem bug):
    (False, reason, None, None), so the experiment records the cross-check as skipped and goes on."""
    ok, info = deepchem_available()
    if not ok:
        return False, info, None, None
    name = MOLNET_FILES[loader]
    path = os.path.join(chemdata.data_dir(), name)
    if not os.path.isfile(path):
        return False, f"{name} is not in the data folder {chemdata.data_dir()}", None, None
    save_dir = chemdata.deepchem_cache_dir(chemdata.record_data_read(path))
    import deepchem as dc
    # DeepChem's ECFP featurizer (CircularFingerprint) always calls RDKit's deprecated
    # GetMorganFingerprintAsBitVect, which logs "DEPRECATION WARNING: please use MorganGenerator" once per
    # molecule; it takes no generator, so RDKit's logger is silenced for this call.  Its bits equal
    # chemdata.morgan_fingerprints' (rdFingerprintGenerator), which the ESOL demo checks (deepchem_check).
    try:
        with chemdata.quiet_rdkit():
            tasks, (ds,), _ = getattr(dc.molnet, loader)(featurizer="ECFP", splitter=None, transformers=[],
                                                         data_dir=chemdata.data_dir(), save_dir=save_dir)
    except Exception as e:          # a network error, a missing optional package, a DeepChem bug
        return False, f"DeepChem's {loader} failed: {type(e).__name__}: {str(e)[:300]}", None, None
    return True, info, tasks, ds


def deepchem_mlp(X, y, cfg, seed, log=print):
    """DeepChem MultitaskRegressor on fingerprint matrices: {part: predictions in units} or a skip reason.

    ``X`` / ``y``: {part: list}.  The target is z-scored with the training mean/std like the Transformer's.
    cfg: layer_sizes, dropouts, epochs, batch_size, learning_rate, weight_decay_penalty."""
    ok, info = deepchem_available()
    if not ok:
        return None, info
    import numpy as np
    import deepchem as dc
    import torch
    torch.manual_seed(seed)
    np.random.seed(seed)
    scaler = evaluation.ZScore().fit(y["train"])
    train = dc.data.NumpyDataset(np.array(X["train"], dtype=np.float32),
                                 np.array(scaler.transform(y["train"]), dtype=np.float32).reshape(-1, 1))
    model = dc.models.MultitaskRegressor(n_tasks=1, n_features=len(X["train"][0]),
                                         layer_sizes=cfg["layer_sizes"], dropouts=cfg["dropouts"],
                                         batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
                                         weight_decay_penalty=cfg.get("weight_decay_penalty", 0.0))
    t0 = time.perf_counter()
    loss = model.fit(train, nb_epoch=cfg["epochs"])
    train_time = time.perf_counter() - t0
    preds = {}
    for part in ("train", "valid", "test"):
        out = model.predict(dc.data.NumpyDataset(np.array(X[part], dtype=np.float32)))
        preds[part] = scaler.inverse([float(v) for v in np.asarray(out).reshape(-1)])
    del model, train       # now, in this process: forked training workers must not inherit the model,
    import gc              # whose __del__ would remove its temporary folder a second time
    gc.collect()
    log(f"DeepChem MLP: {cfg['epochs']} epochs in {common.fmt_time(train_time)}, last loss {loss:.4f}")
    return {"preds": preds, "train_time_s": train_time, "deepchem_version": info}, None


def ridge_run(X, y, alpha):
    """Closed-form ridge fitted on X['train']: {part: predictions}.  Columns that are zero in every
    training row are dropped first: their ridge weight is exactly 0, so the fit is the same, only faster
    (the Cholesky factorisation is cubic in the number of columns)."""
    used = [j for j in range(len(X["train"][0])) if any(row[j] for row in X["train"])]
    cut = {part: [[row[j] for j in used] for row in X[part]] for part in ("train", "valid", "test")}
    model = evaluation.ridge_fit(cut["train"], y["train"], alpha=alpha)
    return {part: evaluation.ridge_predict(model, cut[part]) for part in ("train", "valid", "test")}


def ridge_best(X, y, alphas):
    """Ridge for every alpha, the one with the lowest validation RMSE kept: (valid RMSE, alpha, predictions)."""
    best = None
    for alpha in alphas:
        preds = ridge_run(X, y, alpha)
        v = evaluation.rmse(y["valid"], preds["valid"])
        if best is None or v < best[0]:
            best = (v, alpha, preds)
    return best


def mean_run(y):
    """The mean baseline: the training mean everywhere (its training R^2 is exactly 0)."""
    return {part: evaluation.mean_baseline(y["train"], len(y[part])) for part in ("train", "valid", "test")}


def pick(seq, idx):
    """[seq[i] for i in idx]."""
    return [seq[i] for i in idx]


def parts(seq, split_idx):
    """{part: [seq[i] for i in that part's indices]} for a (train, valid, test) index triple."""
    return {p: pick(seq, ix) for p, ix in zip(("train", "valid", "test"), split_idx)}


def finish(run, results):
    """Write the results (through ``run.finish``), then delete this run's training checkpoints: they only
    exist to resume an interrupted run, and a stale one would block a rerun with another config."""
    import shutil
    path = run.finish(to_json_safe(results))
    folder = os.path.dirname(run.checkpoint("x"))
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    return path


def to_json_safe(obj):
    """Round-trip through JSON (so numpy scalars etc. fail early here, not at the end of a run)."""
    return json.loads(json.dumps(obj))
