"""The committed property models (models/esol_transformer.json, hopv_..., materials_...) are the models their
pages describe: each file states its split, seeds, epochs and selection rule, and everything stored with it
(the domain threshold, the interval's calibration, the validation and test errors, the skill verdict) is
recomputed here from the saved weights through ``predictor.load_predictor`` and must agree within 1e-9.
Also the pieces of ``demos/saved_predictor.py`` on made-up predictions (the conformal choice, the errors by
domain, the skill rule).

    python -m pytest tests/tests_saved_models.py            (the committed files: -m slow)
"""
import json
import math
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import pytest  # noqa: E402  (imported after the sys.path set-up above)

import chemdata  # noqa: E402  (imported after the sys.path set-up above)
import evaluation  # noqa: E402  (imported after the sys.path set-up above)
import predictor  # noqa: E402  (imported after the sys.path set-up above)

STUDIES = {"esol": "deepchem_esol", "hopv": "deepchem_hopv", "materials": "deepchem_materials"}


def _pred(value, spread=None, similarity=None, low=None, high=None, domain="in", text="x"):
    return SimpleNamespace(value=value, spread=spread, similarity=similarity, low=low, high=high, domain=domain,
                           input=text)


def t_calibration_keeps_the_scale_that_validation_prefers_and_its_quantile():
    """calibrate: on inputs whose error grows with the ensemble spread, the spread-scaled interval is narrower
    than a constant one at the same coverage, so it is kept; q is the split-conformal quantile (rank
    ceil((n + 1) 0.9)) of |y - mean| / (spread + offset) over every calibration input."""
    import saved_predictor as sp
    spreads = [0.05 + 0.02 * i for i in range(60)]
    y = [(1 if i % 2 else -1) * 3 * s for i, s in enumerate(spreads)]
    preds = [_pred(0.0, s, 0.5) for s in spreads]
    interval, choice = sp.calibrate(y, preds)
    assert interval["scale"] == "spread", choice
    assert choice["spread"]["mean_width"] < choice["constant"]["mean_width"]
    offset = interval["offset"]
    scores = sorted(abs(t) / (s + offset) for t, s in zip(y, spreads))
    assert interval["q"] == scores[math.ceil(61 * 0.9) - 1]
    assert interval["n_calibration"] == 60 and 0.8 < choice["spread"]["coverage"] < 1.0
    no_sim = [_pred(0.0, s, None) for s in spreads]            # similarity unknown: that scale is not offered
    assert sp.calibrate(y, no_sim)[1]["similarity"] is None


def t_errors_by_domain_and_the_skill_rule():
    """split_errors: RMSE, coverage and width overall and per domain from the predictor's rows; a row without a
    value is an error (the split's own inputs must all be predicted).  skill: beats the mean only when the
    paired interval of the RMSE difference lies below 0."""
    import saved_predictor as sp
    y = [float(i) for i in range(40)]
    good = [_pred(t + (0.1 if i % 2 else -0.1), low=t + (0.01 if i < 2 else -0.2), high=t + 0.2,
                  domain="out" if i < 10 else "in") for i, t in enumerate(y)]          # 2 of 40 missed
    e = sp.split_errors(y, good, 19.5)
    assert abs(e["rmse"] - 0.1) < 1e-12 and e["coverage"] == 38 / 40 and e["by_domain"]["out"]["n"] == 10
    assert abs(e["by_domain"]["in"]["mean_width"] - 0.4) < 1e-12
    assert sp.skill(y, good, 19.5)["beats_mean"] is True
    flat = [_pred(19.5 + (0.01 if i % 2 else -0.01)) for i in range(40)]
    s = sp.skill(y, flat, 19.5)
    assert s["beats_mean"] is False and s["ci_low"] <= s["diff_rmse"] <= s["ci_high"]
    with pytest.raises(ValueError, match="no value"):
        sp.split_errors(y, good[:-1] + [_pred(None, text="C(")], 19.5)


def _results(name):
    with open(os.path.join(ROOT, "figures", f"results_{name}.json"), encoding="utf-8") as f:
        return json.load(f)["results"]


def _split_items(name, saved):
    """(inputs, targets, (train, valid, test) indices) of the committed saved model's split, rebuilt as its
    demo does."""
    import importlib
    demo = importlib.import_module(f"demo_{STUDIES[name]}")
    if name == "esol":
        _, items, y = demo.load(dict(demo.FULL), 0)
        return items, y, demo.make_splits(items, [saved["split"]], 0)[saved["split"]]
    if name == "hopv":
        data = chemdata.load_hopv(demo.TASK)
        return data.smiles, data.y, chemdata.random_split(data.smiles, seed=0, key=chemdata.canonical_smiles)
    return demo.load_splits(demo.FULL, 0, True)[saved["split"]]


def _same_skill(got, stored):
    """The skill block recomputed equals the stored one: the verdict, statement, rule and item count exactly,
    the bootstrap's numbers within 1e-9 (a matmul summed in another order, math.sumprod on 3.12+ against
    sum(map(mul)) on 3.11, moves the last bits of each prediction)."""
    numbers = ("diff_rmse", "ci_low", "ci_high")
    assert set(got) == set(stored)
    assert {k: v for k, v in got.items() if k not in numbers} == {k: v for k, v in stored.items() if k not in numbers}
    assert all(abs(got[k] - stored[k]) < 1e-9 for k in numbers), (got, stored)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STUDIES))
def t_committed_model_is_what_its_page_says(name):
    """The committed model file of ``name``: its meta states split, seeds, epochs and rule (those of
    results.saved_model); reloaded, its domain threshold, interval quantile, errors (RMSE, R², coverage, width;
    validation and test) and skill are recomputed through the predictor and equal what is stored (1e-9).
    Each split is predicted once (``predict_detailed``, two workers: the materials splits hold 2,000 formulas
    each); ``predict``, what the header's user calls, is the values of ``predict_detailed`` (checked on the
    first 100 test inputs), and the header quotes the RMSEs of those values."""
    import property_common as pc
    import saved_predictor as sp
    saved = _results(name)["saved_model"]
    path = os.path.join(ROOT, saved["path"])
    pred = predictor.load_predictor(path)
    meta = pred.meta
    assert meta["selection"]["split"] == saved["split"] and meta["selection"]["seeds"] == saved["seeds"]
    assert meta["selection"]["epochs"] == [m["epoch"] for m in saved["members"]] and meta["selection"]["rule"]
    items, y, idx = _split_items(name, saved)
    valid, test = pc.pick(items, idx[1]), pc.pick(items, idx[2])
    assert test == saved["test_predictions"]["inputs"]
    v_preds, t_preds = pred.predict_detailed(valid, workers=2), pred.predict_detailed(test, workers=2)
    assert [p.similarity for p in v_preds[:20]] == [pred.domain_of(x)[2] for x in valid[:20]]
    assert predictor.domain_threshold([p.similarity for p in v_preds], meta["domain"]["coverage"]) == \
        meta["domain"]["threshold"]
    interval, _ = sp.calibrate(pc.pick(y, idx[1]), [_pred(p.value, p.spread, p.similarity) for p in v_preds])
    assert interval["scale"] == meta["interval"]["scale"] and abs(interval["q"] - meta["interval"]["q"]) < 1e-9
    for part, ix, preds in (("valid", idx[1], v_preds), ("test", idx[2], t_preds)):
        got = sp.split_errors(pc.pick(y, ix), preds, meta["target_mean"])
        for key in ("rmse", "mae", "r2", "mean_rmse", "coverage", "mean_width"):
            assert abs(got[key] - meta["errors"][part][key]) < 1e-9, (part, key, got[key])
    assert meta["skill"] == saved["skill"]
    _same_skill(sp.skill(pc.pick(y, idx[2]), t_preds, meta["target_mean"]), meta["skill"])
    assert pred.predict(test[:100], workers=2) == [p.value for p in t_preds[:100]]
    header = predictor.load_predictor(path).describe()            # the header a user reads
    rmse = {part: evaluation.rmse(pc.pick(y, ix), [p.value for p in preds])
            for part, ix, preds in (("validation", idx[1], v_preds), ("test", idx[2], t_preds))}
    assert f"validation RMSE {rmse['validation']:.3g}, test RMSE {rmse['test']:.3g}" in header, header
    assert (predictor.NO_SKILL_NOTE in header) == (not meta["skill"]["beats_mean"])
