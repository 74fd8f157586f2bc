"""The saved model of a property study (experiments 6-8): the file a user loads with ``predictor.load_predictor``,
built by one stated rule, with every number stored beside it measured through that predictor.

The rule (``RULE``)
-------------------
* The study's headline recipe on the split its page names (``Study.split``), trained on the inputs exactly as
  the predictor reads them: the RDKit canonical SMILES (``predictor.prepare_smiles``, the stereo kinds of the
  training SMILES kept) or the formula written alphabetically with explicit amounts (``formula_explicit``).
* Seeds 0, 1, 2 (``SEEDS``).  Each member keeps the weights of its epoch with the lowest validation RMSE among
  the recipe's epochs (``property_common.best_epoch``, no patience).  The ensemble is all of them: the test
  split chooses nothing.  The prediction is the members' mean, the ``spread`` their standard deviation.
* The comparison rows of the page keep the tutorial's input (the file's spellings); the members are an extra,
  labelled row (``Study.row``) of ``results.runs``.

Measured through the predictor (``measure``), on the split's inputs as written in the data file, exactly as a
user calls ``load_predictor(path).predict_detailed(...)``:
* the applicability domain's similarity threshold (validation; ``property_common.domain_threshold``);
* the 90 % split-conformal interval (``calibrate``): scores |y - mean| / (u + offset) on the validation split,
  u the ensemble spread, 1 - the nearest-training-neighbour similarity, or 0 (a constant width); the scale
  with the narrowest mean width over ``REPEATS`` random halvings of the validation split (calibrated on one
  half, measured on the other) is kept, and its quantile is taken over the whole validation split;
* the validation and test errors (RMSE, MAE, R², the training mean's RMSE and R²), coverage and mean width of
  the interval, in and out of the domain;
* skill: the test RMSE against the training mean's, a paired bootstrap over the test inputs; without an
  interval below 0 the file says "no better than predicting the training mean on test" on every row;
* cost: seconds per molecule for one member and for the ensemble, on one process and on two.

All of it goes into the file's meta (``interval``, ``errors``, ``skill``, ``selection``) and into
``results.saved_model``; ``check_file`` recomputes it from the file and must agree within 1e-9.
"""
import json
import os
import random
import statistics
import time
from collections import namedtuple

import common
import property_common as pc

import chemdata
import formulas
import evaluation
import predictor
import safe_io

SEEDS = (0, 1, 2)
LEVEL = 0.9
SCALES = ("constant", "spread", "similarity")
SCALE_MEANING = {"constant": "0 (a constant width)", "spread": "the members' standard deviation",
                 "similarity": "1 - similarity to the nearest training input"}     # u, as predictor.interval_scale
REPEATS = 200
WORKERS = 2
SPREAD_TEXT = "sample standard deviation (n - 1) of the members' predictions, in the target's units"
RULE = ("the headline recipe on the {split} split, trained on the inputs as the predictor reads them ({inputs}), "
        "seeds {seeds}; each member keeps the weights of its epoch with the lowest validation RMSE among the "
        "recipe's {epochs} epochs; the ensemble is every member (the test split chooses nothing)")
INPUTS = {"smiles_atom": "RDKit canonical SMILES", "formula": "formulas written alphabetically with explicit amounts"}
TOKENIZE = {"smiles_atom": chemdata.tokenize_smiles, "formula": formulas.tokenize_formula}

Study = namedtuple("Study", ["name", "path", "tokenizer", "units", "task", "split", "row", "max_tokens", "meta"],
                   defaults=(None, None))
Study.__doc__ = """What a property demo tells this module: its name (results_<name>), model path, tokenizer
('smiles_atom' or 'formula'), units, task, the split its headline uses, the label of the members' row in
results.runs, the id limit of its inputs (None: none) and extra meta for the file (formula_style)."""


# ----------------------------------------------------------------------------- inputs as the predictor reads them


def as_read(items, tokenizer, train_items):
    """The strings the predictor reads for ``items``: the RDKit canonical SMILES, with the stereo kinds of
    ``train_items`` kept and the others removed (as the predictor does), or the formula written alphabetically
    with explicit amounts.  ValueError naming the first input RDKit cannot read."""
    if tokenizer == "formula":
        return [formulas.formula_explicit(f) for f in items]
    keep = predictor.smiles_preparation_record(train_items)["stereo_in_training"]
    out = []
    for s in items:
        canonical, _ = predictor.prepare_smiles(s, keep)
        if canonical is None:
            raise ValueError(f"saved model: RDKit cannot read {s!r}, so no predictor could either")
        out.append(canonical)
    return out


# ----------------------------------------------------------------------------- training and the file


def train_members(run, study, cfg, items, y, idx, seeds):
    """Train one member per seed on the inputs as read (``cfg``: the recipe, or a function of the vocabulary
    size giving it); returns (vocab, [fit], prepared inputs, the recipe)."""
    read = as_read(items, study.tokenizer, pc.pick(items, idx[0]))
    T = {p: [TOKENIZE[study.tokenizer](s) for s in v] for p, v in pc.parts(read, idx).items()}
    vocab = chemdata.Vocab.build(T["train"])
    ids = {p: pc.encode(T[p], vocab, study.max_tokens)[0] for p in T}
    cfg = cfg(len(vocab)) if callable(cfg) else cfg
    fits = []
    for s in seeds:
        run.log(f"{study.name} saved model: member seed {s} on {len(ids['train'])} {INPUTS[study.tokenizer]}")
        fits.append(pc.train_encoder(ids, pc.parts(y, idx), cfg, seed=s, tag=f"{study.name} saved s{s}",
                                     vocab_size=len(vocab), pad_id=vocab.pad_id, log=run.log, keep_best=True,
                                     checkpoint=run.checkpoint(f"saved_{study.split}_s{s}"), patience=None))
    return vocab, fits, read, cfg


def write_file(path, study, cfg, vocab, fits, seeds, read, y, idx):
    """Write the ensemble's model file (members 2.. in meta.ensemble.extra_weights); returns its selection record."""
    scaler = fits[0]["scaler"]
    if any(abs(f["scaler"].mean - scaler.mean) > 1e-12 or abs(f["scaler"].std - scaler.std) > 1e-12 for f in fits):
        raise ValueError("saved model: the members were fitted on different targets")
    members = [{"seed": s, "epoch": f["best"]["epoch"], "valid_rmse": f["best"]["value"]} for s, f in zip(seeds, fits)]
    selection = {"rule": RULE.format(split=study.split, inputs=INPUTS[study.tokenizer],
                                     seeds=", ".join(map(str, seeds)), epochs=len(fits[0]["curve"])),
                 "split": study.split, "seeds": list(seeds), "epochs": [m["epoch"] for m in members],
                 "input": INPUTS[study.tokenizer], "row": study.row}
    ensemble = {"members": members, "spread": SPREAD_TEXT,
                "extra_weights": [{p.name: p.data for p in f["model"].params()} for f in fits[1:]]}
    extra = dict(study.meta or {}, split=study.split, seed=seeds[0], epoch=members[0]["epoch"],
                 selection=selection, ensemble=ensemble)
    pc.save_predictor(fits[0]["model"], path, tokenizer=study.tokenizer, vocab=vocab, scaler=scaler,
                      units=study.units, task=study.task, train_items=pc.pick(read, idx[0]),
                      train_y=pc.pick(y, idx[0]), max_tokens=study.max_tokens, extra=extra)
    return dict(selection, members=members)


def _update_meta(path, **fields):
    """Put ``fields`` into the model file's meta (atomic rewrite)."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    obj["meta"].update(fields)
    safe_io.atomic_write(path, json.dumps(obj, allow_nan=False, separators=(",", ":")))


# ----------------------------------------------------------------------------- the interval


def _scales(kind, preds):
    """u of every prediction for a scale kind (None where it cannot be had)."""
    return [predictor.interval_scale(kind, p.spread, p.similarity) for p in preds]


def _offset(kind, us):
    """The constant added to u: 1 for the constant width, else the median u over the calibration inputs
    (so that an input with u = 0 still gets an interval), at least 1e-6."""
    return 1.0 if kind == "constant" else max(1e-6, statistics.median(us))


def _halvings(y, preds, us, offset, seed=0):
    """Mean width and coverage of the interval calibrated on one random half of the inputs and measured on the
    other, over REPEATS halvings (``seed`` fixes them)."""
    scores = [abs(t - p.value) / (u + offset) for t, p, u in zip(y, preds, us)]
    rng, n, widths, covered = random.Random(seed), len(scores), [], []
    for _ in range(REPEATS):
        order = list(range(n))
        rng.shuffle(order)
        cal, held = order[:n // 2], order[n // 2:]
        q = predictor.conformal_quantile([scores[i] for i in cal], LEVEL)
        if q == float("inf"):             # too few inputs in a half for a finite quantile: no comparison
            return {"mean_width": None, "coverage": None, "offset": offset}
        widths.append(statistics.fmean(2 * q * (us[i] + offset) for i in held))
        covered.append(statistics.fmean(scores[i] <= q for i in held))
    return {"mean_width": statistics.fmean(widths), "coverage": statistics.fmean(covered), "offset": offset}


def calibrate(y, preds, level=LEVEL):
    """The interval block of the file: the scale (of SCALES) with the narrowest mean width over the
    validation halvings, and its split-conformal quantile over every validation input."""
    choice = {}
    for kind in SCALES:
        us = _scales(kind, preds)
        choice[kind] = None if any(u is None for u in us) else _halvings(y, preds, us, _offset(kind, us))
    usable = [k for k in SCALES if choice[k] is not None and choice[k]["mean_width"] is not None]
    kind = min(usable, key=lambda k: (choice[k]["mean_width"], SCALES.index(k))) if usable else "constant"
    us = _scales(kind, preds)
    offset = _offset(kind, us)
    q = predictor.conformal_quantile([abs(t - p.value) / (u + offset) for t, p, u in zip(y, preds, us)], level)
    if q == float("inf"):
        raise ValueError(f"saved model: {len(y)} validation inputs are too few for a {level:.0%} split-conformal "
                         f"interval (the quantile's rank ceil((n + 1) {level}) exceeds n)")
    how = (f"the scale of {', '.join(SCALES)} with the narrowest mean width over {REPEATS} halvings of the "
           "validation split" if usable else "the constant width: the validation split is too small to compare "
           "scales on its halves")
    rule = (f"split-conformal at {level:.0%} on the {len(y)} validation inputs: half-width q * (u + offset), "
            f"u = {SCALE_MEANING[kind]}; {how}")
    return {"level": level, "scale": kind, "q": q, "offset": offset, "n_calibration": len(y), "rule": rule}, choice


# ----------------------------------------------------------------------------- errors through the predictor


def _group(y, preds, mean_value):
    """n, RMSE, MAE, R², the training mean's RMSE and R², coverage and mean width (None without intervals)."""
    values = [p.value for p in preds]
    out = dict(pc.metrics(y, values), mean_rmse=evaluation.rmse(y, [mean_value] * len(y)),
               mean_r2=evaluation.r2(y, [mean_value] * len(y)) if len(y) > 1 else None)
    if any(p.low is None for p in preds):
        return dict(out, coverage=None, mean_width=None)
    return dict(out, coverage=statistics.fmean(p.low <= t <= p.high for t, p in zip(y, preds)),
                mean_width=statistics.fmean(p.high - p.low for p in preds))


def split_errors(y, preds, mean_value):
    """The errors of one split through the predictor, overall and by domain ('in', 'out', 'not checked')."""
    bad = [p.input for p in preds if p.value is None]
    if bad:
        raise ValueError(f"saved model: the predictor gave no value for {len(bad)} input(s) of the split, "
                         f"first {bad[0]!r}")
    rec = _group(y, preds, mean_value)
    rec["by_domain"] = {}
    for d in ("in", "out", "not checked"):
        ix = [i for i, p in enumerate(preds) if p.domain == d]
        if ix:
            rec["by_domain"][d] = _group([y[i] for i in ix], [preds[i] for i in ix], mean_value)
    return rec


def skill(y, preds, mean_value):
    """Test RMSE of the predictor minus the training mean's, paired bootstrap over the test inputs; the model
    beats the mean only when the whole 95 % interval is below 0."""
    boot = evaluation.paired_bootstrap(y, [p.value for p in preds], [mean_value] * len(y), metric="rmse")
    beats = boot["ci_high"] < 0
    statement = predictor.SKILL_NOTE if beats else predictor.NO_SKILL_NOTE
    return {"beats_mean": beats, "statement": statement, "diff_rmse": boot["diff"], "ci_low": boot["ci_low"],
            "ci_high": boot["ci_high"], "n_items": boot["n_items"],
            "rule": "test RMSE minus the training mean's, 95 % paired bootstrap over the test inputs (2,000 "
                    "resamples); beats the mean when the interval lies below 0"}


def _through(path, items, workers=WORKERS, **options):
    """``load_predictor(path).predict_detailed(items)``, as a user calls it."""
    return predictor.load_predictor(path, **options).predict_detailed(items, workers=workers)


def cost(path, items):
    """Seconds per input for one member and for the ensemble, on one process and on WORKERS."""
    out = {"n_inputs": len(set(items)), "timed": "predict_detailed on a loaded predictor (a first input predicted "
                                                  "before the clock starts: imports and the training reference)"}
    for label, options in (("single", {"max_members": 1}), ("ensemble", {})):
        for workers in (1, WORKERS):
            p = predictor.load_predictor(path, **options)
            p.predict_detailed(items[:1])
            t0 = time.perf_counter()
            p.predict_detailed(items, workers=workers)
            out[f"{label}_workers{workers}_s_per_input"] = (time.perf_counter() - t0) / out["n_inputs"]
    return out


def measure(path, items, y, idx):
    """Set the domain threshold, calibrate the interval and measure everything on the file (see the module
    docstring); writes interval, errors and skill into its meta and returns the record for the results."""
    valid, test = (pc.pick(items, idx[1]), pc.pick(y, idx[1])), (pc.pick(items, idx[2]), pc.pick(y, idx[2]))
    domain = pc.domain_threshold(path, valid[0])
    loaded = predictor.load_predictor(path)
    mean_value = loaded.meta["target_mean"]
    interval, choice = calibrate(valid[1], _through(path, valid[0]))
    interval["n_members"] = len(loaded.members)       # calibrated for the mean of this many: used only with them
    _update_meta(path, interval=interval)
    preds = {"valid": _through(path, valid[0]), "test": _through(path, test[0])}
    errors = {"how": "predictor.load_predictor(path).predict_detailed on the split's inputs as written in the data "
                     "file", "valid": split_errors(valid[1], preds["valid"], mean_value),
              "test": split_errors(test[1], preds["test"], mean_value)}
    sk = skill(test[1], preds["test"], mean_value)
    _update_meta(path, errors=errors, skill=sk)
    test_rows = {"inputs": test[0], "y_true": test[1],
                 **{k: [getattr(p, k) for p in preds["test"]]
                    for k in ("value", "low", "high", "spread", "domain", "similarity")}}
    return {"domain": domain, "interval": dict(interval, choice=choice), "errors": errors, "skill": sk,
            "test_predictions": test_rows, "cost": cost(path, valid[0] + test[0])}


def check_file(path, saved, items, y, idx):
    """Recompute from the file what ``measure`` stored (test values, errors, skill): {name: True/False}."""
    test = pc.pick(items, idx[2])
    preds = _through(path, test)
    meta = predictor.load_predictor(path).meta
    stored = saved["test_predictions"]
    same = all(abs(p.value - v) <= 1e-9 for p, v in zip(preds, stored["value"]))
    rmse = abs(split_errors(pc.pick(y, idx[2]), preds, meta["target_mean"])["rmse"] - meta["errors"]["test"]["rmse"])
    return {"saved_test_predictions_recompute": same and len(preds) == len(stored["value"]),
            "saved_errors_recompute": rmse <= 1e-9, "saved_meta_equals_results": meta["skill"] == saved["skill"]}


# ----------------------------------------------------------------------------- the stage


def skipped_note(path, trainings="3 more trainings"):
    """results.saved_model in the default mode: why no model was trained (``trainings``: what it would cost)."""
    return (f"not trained in the default mode ({trainings}): --extended or --saved-model trains the saved model "
            f"and writes {path}")


def added_note(recipe, path, recomputed="summary, comparisons and checks"):
    """The ``updates`` line of a --saved-model run: the rule's ``recipe``, the file, what was recomputed."""
    return (f"the saved model (saved_predictor.RULE: {recipe}) trained, written to {path} and measured through the "
            f"predictor; its members' row added; {recomputed} recomputed from the stored predictions")


def build(run, study, cfg, items, y, idx, test_ids, seeds=SEEDS):
    """The whole stage: train the members, write the file, measure it through the predictor, check it.
    Returns (results.saved_model record, the members' run records for results.runs)."""
    t0 = time.perf_counter()
    path = study.path if not common.QUICK else os.path.join(run.out_dir, os.path.basename(study.path))
    vocab, fits, read, cfg = train_members(run, study, cfg, items, y, idx, seeds)
    selection = write_file(path, study, cfg, vocab, fits, seeds, read, y, idx)
    record = dict(selection, path=os.path.relpath(path, common.ROOT), n_params=fits[0]["n_params"],
                  config=cfg, train_time_s=sum(f["train_time_s"] for f in fits))
    record.update(measure(path, items, y, idx))
    record["checks"] = check_file(path, record, items, y, idx)
    record["wall_time_s"] = time.perf_counter() - t0
    Y = pc.parts(y, idx)
    runs = [pc.run_record(study.split, study.row, s, Y, f["best"]["preds"], test_ids, epoch=f["best"]["epoch"],
                          train_time_s=f["train_time_s"], n_params=f["n_params"], vocab_size=len(vocab),
                          input=INPUTS[study.tokenizer]) for s, f in zip(seeds, fits)]
    e = record["errors"]
    run.log(f"saved {path}: valid RMSE {e['valid']['rmse']:.3f}, test RMSE {e['test']['rmse']:.3f} through the "
            f"predictor; {record['interval']['scale']}-scaled {LEVEL:.0%} interval covers "
            f"{e['test']['coverage']:.2f} of test; {record['skill']['statement']}")
    return record, runs


def replace_rows(runs, row, new):
    """``runs`` without the records of ``row``, then ``new`` (a rerun of the stage replaces its rows)."""
    return [r for r in runs if r["model"] != row] + new
