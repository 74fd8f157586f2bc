"""Shared pieces of the three property-prediction demos (experiments 6, 7, 8: ESOL, materials, HOPV).

A demo builds its splits and baselines; this module does the parts they have in common:

* ``encode`` - token lists -> id lists with <bos>/<eos>, truncated to a maximum length (counted);
* ``train_encoder`` - a ``TransformerEncoder`` (mean pooling, one regression output) trained with
  ``transformer.train`` + ``regression_loss`` on the z-scored target, predictions for every split back
  in the target's units, per-epoch learning curve (train / valid RMSE in the target's units);
* ``metrics`` / ``split_metrics`` - RMSE, MAE, R^2, Pearson;
* ``run_record`` - the ``results.runs[*]`` record {split, model, seed, metrics, test_ids, y_true, y_pred};
* ``summarize`` - mean and std over seeds of every (split, model) pair;
* ``save_predictor`` - the model file ``chemdata.load_predictor`` reads (weights + meta: tokenizer,
  vocabulary, target scaling, units, task, training-data sha256);
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

tf = common.tf


# ----------------------------------------------------------------------------- tokens


def encode(token_lists, vocab, max_tokens=None):
    """Id lists (<bos> tokens <eos>) and the number of inputs cut to ``max_tokens`` ids in total.

    Truncation keeps the first ``max_tokens - 1`` ids and puts <eos> last, so every input still ends
    with <eos>; ``chemdata.Predictor`` applies the same rule at prediction time."""
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
    return {"rmse": chemdata.rmse(y_true, y_pred), "mae": chemdata.mae(y_true, y_pred),
            "r2": chemdata.r2(y_true, y_pred), "pearson": None if constant else chemdata.pearson(y_true, y_pred),
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
    """Mean and std (over seeds) of the train/valid/test RMSE, MAE, R^2 of every (split, model) pair,
    in the order the pairs first appear."""
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


# ----------------------------------------------------------------------------- Transformer


def predict_z(model, id_lists):
    """Model outputs (z units) for many inputs; forked workers through ``tf.parallel_map`` (results in input
    order) for more than a handful, one process below that (forking costs more than it saves)."""
    if len(id_lists) > 64:
        return tf.parallel_map(lambda ids, rng: model.forward(ids)[0], id_lists)
    return [model.forward(ids)[0] for ids in id_lists]


def train_encoder(ids, y, cfg, *, seed, tag, vocab_size, pad_id, checkpoint=None, workers=None, log=print,
                  token_features=None):
    """Train one TransformerEncoder on the z-scored target and predict every split.

    ``ids`` / ``y``: {part: list} for 'train', 'valid', 'test' (y in the target's units).  ``cfg`` holds
    d_model, n_heads, n_layers, d_ff (optional), max_len, epochs or max_steps, batch_size, lr, warmup.
    ``token_features``: optional fixed per-id features added through a learned projection (periodic-table
    priors).  Returns {model, scaler, preds (units), history, curve, train_time_s, predict_time_s, n_params}."""
    scaler = chemdata.ZScore().fit(y["train"])
    model = tf.TransformerEncoder(vocab_size, d_model=cfg["d_model"], n_heads=cfg["n_heads"],
                                  n_layers=cfg["n_layers"], d_ff=cfg.get("d_ff"), max_len=cfg["max_len"],
                                  pad_id=pad_id, pos=cfg.get("pos", "sine"), seed=seed,
                                  token_features=token_features)
    train_data = list(zip(ids["train"], scaler.transform(y["train"])))
    valid_data = list(zip(ids["valid"], scaler.transform(y["valid"])))
    kw = dict(valid_data=valid_data, epochs=cfg["epochs"], batch_size=cfg["batch_size"], lr=cfg["lr"],
              warmup=cfg["warmup"], clip=cfg.get("clip", 1.0), seed=seed, workers=workers,
              max_steps=cfg.get("max_steps"), tag=tag, checkpoint=checkpoint)
    history = tf.train(model, train_data, tf.regression_loss, **kw)
    train_time = history["wall_time"]      # summed over every call of a run resumed from its checkpoint
    t0 = time.perf_counter()
    preds = {part: scaler.inverse(predict_z(model, ids[part])) for part in ("train", "valid", "test")}
    predict_time = time.perf_counter() - t0
    log(f"{tag}: trained in {common.fmt_time(train_time)}, predicted {sum(map(len, ids.values()))} inputs "
        f"in {common.fmt_time(predict_time)}")
    return {"model": model, "scaler": scaler, "preds": preds, "history": history,
            "curve": learning_curve(history, scaler.std), "train_time_s": train_time,
            "predict_time_s": predict_time, "n_params": tf.param_count(model)}


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
    """Write the self-contained model file ``chemdata.load_predictor`` reads (atomic)."""
    meta = {"kind": "chemdata.Predictor", "tokenizer": tokenizer, "vocab_tokens": vocab.tokens,
            "vocab_specials": list(vocab.SPECIALS), "target_mean": scaler.mean, "target_std": scaler.std,
            "units": units, "task": task, "max_tokens": max_tokens, "n_train": len(train_items),
            "train_data_sha256": data_sha256(train_items, train_y)}
    meta.update(extra or {})
    tf.save_model(model, path, meta)
    return meta


# ----------------------------------------------------------------------------- DeepChem MLP


def deepchem_available():
    """(True, version) or (False, reason): DeepChem cannot be installed on Python >= 3.12, for instance."""
    try:
        import deepchem
        return True, deepchem.__version__
    except Exception as e:       # ImportError, or a broken backend raising something else
        return False, f"deepchem not importable: {type(e).__name__}: {e}"


def deepchem_molnet(loader):
    """(available, info, tasks, dataset): DeepChem's MoleculeNet ``loader`` ('load_delaney', 'load_hopv')
    with ECFP features, unsplit and untransformed, its data and save folders under data/; when DeepChem is
    missing, (False, reason, None, None)."""
    ok, info = deepchem_available()
    if not ok:
        return False, info, None, None
    import deepchem as dc
    data_dir = os.path.join(common.ROOT, "data")
    tasks, (ds,), _ = getattr(dc.molnet, loader)(featurizer="ECFP", splitter=None, transformers=[],
                                                 data_dir=data_dir, save_dir=os.path.join(data_dir, "deepchem_save"))
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
    scaler = chemdata.ZScore().fit(y["train"])
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
    model = chemdata.ridge_fit(cut["train"], y["train"], alpha=alpha)
    return {part: chemdata.ridge_predict(model, cut[part]) for part in ("train", "valid", "test")}


def ridge_best(X, y, alphas):
    """Ridge for every alpha, the one with the lowest validation RMSE kept: (valid RMSE, alpha, predictions)."""
    best = None
    for alpha in alphas:
        preds = ridge_run(X, y, alpha)
        v = chemdata.rmse(y["valid"], preds["valid"])
        if best is None or v < best[0]:
            best = (v, alpha, preds)
    return best


def mean_run(y):
    """The mean baseline: the training mean everywhere (its training R^2 is exactly 0)."""
    return {part: chemdata.mean_baseline(y["train"], len(y[part])) for part in ("train", "valid", "test")}


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
