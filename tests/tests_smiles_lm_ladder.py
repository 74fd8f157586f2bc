"""Tests of experiment 4's recipe ladder (demos/smiles_lm_ladder.py) and of what its samples are held against:
the rule that says a rung beats the n-gram, the ladder a QUICK --extended run writes, and the shape records
(forced endings, validity by length, rings and heavy atoms against the training molecules).

    python -m pytest tests/tests_smiles_lm_ladder.py
"""
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import tests_studies  # noqa: E402  (the shared QUICK runs)
from tests_studies import slow  # noqa: E402  (imported after the sys.path set-up above)

import smiles_lm_ladder as ladder  # noqa: E402  (imported after the sys.path set-up above)


def _records(means, n_items=40, noise=0.3, seed=0):
    """Fake seed records: per-molecule bits around ``mean`` x 20 tokens; bits/token = the mean over tokens."""
    rng = random.Random(seed)
    out = []
    for s, m in enumerate(means):
        bits = [20 * m + rng.gauss(0, noise) for _ in range(n_items)]
        out.append({"seed": s, "test_molecule_bits": bits, "test_bits_per_token": sum(bits) / (20 * n_items)})
    return out


def t_ladder_rule_needs_the_paired_interval_and_a_gap_beyond_the_spread():
    """'better' only when the pooled paired interval lies below 0 AND the gap in bits/token exceeds the seeds'
    range; a clear interval with seeds spread wider than the gap is 'level'; the mirror is 'worse'."""
    rng = random.Random(1)
    ngram = [20 * 2.2 + rng.gauss(0, 0.3) for _ in range(40)]
    ngram_bpt = sum(ngram) / (20 * 40)
    better = ladder.beats_ngram(_records([2.10, 2.11, 2.12]), ngram, ngram_bpt)
    assert better["verdict"] == "better" and better["paired_bootstrap"]["ci_high"] < 0
    assert better["seed_spread"] < -better["gap_bits_per_token"]
    spread = ladder.beats_ngram(_records([1.95, 2.12, 2.18]), ngram, ngram_bpt)   # mean below, seeds wide apart
    assert spread["paired_bootstrap"]["ci_high"] < 0 and spread["verdict"] == "level", spread
    worse = ladder.beats_ngram(_records([2.30, 2.31, 2.32]), ngram, ngram_bpt)
    assert worse["verdict"] == "worse" and worse["paired_bootstrap"]["ci_low"] > 0
    same = ladder.beats_ngram(_records([2.2, 2.2, 2.2], noise=0.3, seed=5), ngram, ngram_bpt)
    assert same["verdict"] == "level"
    assert set(better["per_seed"]) == {"0", "1", "2"}


def t_ladder_recipes_add_one_change_a_rung():
    """Each rung keeps what the rung before it had and adds one thing; dropout is 0 before its rung."""
    config = {"epochs": 6}
    r = [ladder.recipe(name, config, 40, 0.1) for name in ladder.RUNGS]
    assert [x["epochs"] for x in r] == [6, 6, 40, 40, 40]
    assert [x["loss_reduction"] for x in r] == ["sample"] + ["token"] * 4
    assert [x["early_stopping"] for x in r] == [False, False, True, True, True]
    assert [x["dropout"] for x in r] == [0.0, 0.0, 0.0, 0.1, 0.1]
    assert [x["augment"] for x in r] == [False] * 4 + [True]
    rate, table = ladder.choose_rate([{"dropout": 0.1, "valid_bits_per_token": 2.0},
                                      {"dropout": 0.2, "valid_bits_per_token": 1.9},
                                      {"dropout": 0.1, "valid_bits_per_token": 2.1}])
    assert rate == 0.2 and [t["rate"] for t in table] == [0.1, 0.2]


@slow
def t_smiles_lm_extended_quick_ladder_pairs_every_rung_with_the_ngram():
    """The QUICK --extended run trains every rung for every seed, restores early stopping's epoch, pairs each
    rung with the n-gram over the same test molecules, and its torch tutorial rung matches the core's run."""
    r = tests_studies.quick_results("smiles_lm", "smiles_lm", "--extended")
    lad = r["ladder"]
    seeds = lad["seeds"]
    assert [x["rung"] for x in lad["rungs"]] == list(ladder.RUNGS)
    assert sorted((x["rung"], x["seed"]) for x in lad["runs"]) == sorted((g, s) for g in ladder.RUNGS for s in seeds)
    n_test = len(r["fit"]["test_molecule_bits"])
    for run in lad["runs"]:
        assert len(run["test_molecule_bits"]) == n_test and "weights" not in run
        best = min(run["curve"], key=lambda e: e["valid_bits_per_token"]) if run["recipe"]["early_stopping"] \
            else run["curve"][-1]
        assert run["chosen"]["epoch"] == best["epoch"], run["rung"]
    for row in lad["rungs"]:
        assert row["verdict"] in ("better", "level", "worse") and row["paired_bootstrap"]["n_items"] == n_test
    assert lad["dropout_rate"] in lad["dropout_rates"] and lad["tutorial_rung_check"]["agree"]
    assert lad["best_rung"] in ladder.RUNGS and lad["best_sampling"]["sampling"]
    ng = r["ngram"]
    assert ng["variant"] in ("interpolated", "modified") and set(ng["interior"]) == {"n_interior", "discount_interior"}
    probe = r["constraint_probe"]                                  # the constraint's parts, one change a row
    ring = {"close_on_eos": True, "max_ring_size": r["data"]["train_shape"]["max_ring"]}
    assert [x["options"] for x in probe] == [{}, {}, {"close_on_eos": True}, ring, dict(ring, lookahead=True)]
    for x in probe[-2:]:                                           # no ring above the limit
        assert x["n_valid"] == 0 or x["shape"]["share_ring_larger_than"] == 0
    assert probe[-1]["stop_reason_counts"].get("no_allowed_token", 0) == 0   # lookahead: no dead end
    cand = r["constraint_candidate"]                               # before -> after: the same settings and draws
    assert cand["options"] == probe[-1]["options"] == dict(ring, lookahead=True)
    head = [x for x in r["sampling"] if x["constrained"]]
    assert [(x["temperature"], x["top_k"], x["n"]) for x in cand["rows"]] == [
        (x["temperature"], x["top_k"], x["n"]) for x in head]
    for x in cand["rows"]:                                         # the candidate: no ring above the limit, no dead end
        assert x["n_valid"] == 0 or x["shape"]["share_ring_larger_than"] == 0
        assert x["stop_reason_counts"].get("no_allowed_token", 0) == 0
        assert max(x["closed_on_eos_share"], x["forced_share"]) + x["own_eos_share"] <= 1 + 1e-12   # own: neither
        assert round(x["own_eos_share"] * x["n"]) <= x["stop_reason_counts"].get("eos", 0)
        assert sum(y["n_valid"] for y in x["shape_by_ending"].values()) == x["n_valid"]   # where its shape comes from
    by_head = {(x["temperature"], x["top_k"]): x for x in head}        # the headline settings: paired by stream
    for x in (x for x in cand["rows"] if x["n_valid"] and by_head[x["temperature"], x["top_k"]]["n_valid"]
              and (x["temperature"], x["top_k"]) in ((1.0, None), (1.0, 5))):
        for k in ("ks_heavy_atoms", "ks_rings"):
            p, h = x["paired_shape"][k], by_head[x["temperature"], x["top_k"]]
            assert abs(p["diff"] - (x["shape"][k] - h["shape"][k])) < 1e-12 and p["ci_low"] <= p["ci_high"], p
            assert p["n_items"] == x["n"]


def t_smiles_lm_quick_records_forced_endings_shapes_and_validity_by_length():
    """Every constrained row stores per sample whether the budget forced its ending and the validity of the
    rest; every row its validity per length bin (adding up to n) and the valid samples' shape against the
    training molecules; the budget is never below the longest training molecule and no valid constrained
    sample has a ring larger than the training molecules' largest."""
    import chemdata
    import generation_metrics
    import demo_smiles_lm as demo
    r, _ = tests_studies._smiles_lm()
    ts = r["data"]["train_shape"]
    config = dict(demo.FULL, **demo.QUICK_OVERRIDES)
    train = demo.load_split(config)["train"]
    longest = max(len(chemdata.tokenize_smiles(s)) for s in train) + 1                   # <eos> included
    assert r["sampling_sizes"]["constraint_budget"] >= min(longest, config["max_new_tokens"])   # QUICK caps at 40
    assert demo.FULL["max_new_tokens"] >= 98                                  # ESOL's longest, <eos> included
    assert ts["max_ring"] == max(generation_metrics.molecule_shape(s)["largest_ring"] for s in train)
    for x in r["sampling"]:
        assert sum(b["n"] for b in x["validity_by_length"]) == x["n"]
        assert sum(b["valid"] for b in x["validity_by_length"]) == x["n_valid"]
        if x["n_valid"]:
            assert x["shape"]["n_valid"] == x["n_valid"]
        if x["constrained"]:
            assert len(x["forced"]) == x["n"] and 0 <= x["forced_share"] <= 1
            if x["n_valid"]:
                assert 0 <= x["shape"]["share_ring_larger_than"] <= 1
            by = x["shape_by_ending"]                      # every valid sample in exactly one ending's shape
            assert tuple(by) == demo.ENDINGS and sum(y["n_valid"] for y in by.values()) == x["n_valid"], by
            assert by["own <eos>"]["n_valid"] <= round(x["own_eos_share"] * x["n"]), by
            assert by["closed at <eos>"]["n_valid"] <= round(x["closed_on_eos_share"] * x["n"]), by
            assert by["forced"]["n_valid"] <= sum(x["forced"]), by


def t_smiles_lm_shape_by_ending_splits_the_valid_samples_by_how_they_ended():
    """shape_by_ending: a forced sample counts as forced even when it was also closed at the model's <eos>; a
    closed one as closed; the rest as the model's own <eos>; invalid samples nowhere; each part's shape is
    shape_record's of its valid SMILES (the mean heavy atoms, the KS against training)."""
    import demo_smiles_lm as demo
    train = demo.TrainingSet.of(["CCO", "c1ccccc1", "CCCCCC", "CC(=O)O"])

    def st(forced=False, closed=False):
        return {"undos": 0, "forced_closures": 0, "forced": forced, "closed_on_eos": closed}
    samples = [(None, "eos", 0.0, st()), (None, "eos", 0.0, st(closed=True)), (None, "eos", 0.0, st(True, True)),
               (None, "eos", 0.0, st()), (None, "eos", 0.0, st(closed=True))]
    strings = ["CC", "c1ccccc1CC", "CCCCCCCCCC", "CCO", "C1CC"]
    canon = ["CC", "CCc1ccccc1", "CCCCCCCCCC", "CCO", None]           # the last is invalid
    by = demo.shape_by_ending(samples, strings, canon, train)
    assert {k: v["n_valid"] for k, v in by.items()} == {"own <eos>": 2, "closed at <eos>": 1, "forced": 1}
    assert by["own <eos>"]["mean_heavy_atoms"] == 2.5 and by["forced"]["mean_heavy_atoms"] == 10
    assert by["closed at <eos>"] == demo.shape_record(["c1ccccc1CC"], train)


def _tiny_lm_and_vocab():
    """A 1-layer LM over a vocabulary built from a few SMILES (untrained: its samples are varied)."""
    import chemdata
    import demo_smiles_lm as demo
    smiles = ["CCO", "c1ccccc1", "CC(=O)N", "C1CCCC1Cl", "OCC(C)Br"]
    vocab, _ = demo.build_vocab([chemdata.tokenize_smiles(s) for s in smiles], 20)
    model = demo.core.TransformerLM(len(vocab), d_model=8, n_heads=2, n_layers=1, d_ff=16, seed=3)
    return demo, model, vocab


def _draws(demo, model, vocab, counts, stream="tiny", seed=0, order=(0, 1, 2)):
    """sample_all over three settings with the given counts (in ``order``): {setting key: token lists}."""
    import smiles_grammar
    base = [dict(temperature=1.0, top_k=None, constrained=False), dict(temperature=1.0, top_k=None, constrained=True),
            dict(temperature=0.7, top_k=5, constrained=False)]
    setting_list = [dict(base[k], n=counts[k]) for k in order]
    config = {"max_new_tokens": 12, "backtrack": 5}
    per, _ = demo.sample_all(model, vocab, config, setting_list, seed,
                             lambda: smiles_grammar.SmilesConstraint(vocab, max_new_tokens=12, close_on_eos=True),
                             tag=None, stream=stream)
    return {(s["temperature"], s["top_k"], s["constrained"]): [x[0] for x in out] for s, out in zip(setting_list, per)}


def t_each_sampling_setting_draws_from_its_own_stream_whatever_the_other_counts():
    """Default mode samples the headline settings 2,000 times, --extended 10,000: the rows sampled after them
    must not see other random numbers.  Every setting's first n samples are the same whatever the counts of the
    settings before it, its own count or the order of the settings (demo_smiles_lm.setting_stream); another
    seed or another stream name gives other samples."""
    demo, model, vocab = _tiny_lm_and_vocab()
    small = _draws(demo, model, vocab, (3, 2, 4))
    large = _draws(demo, model, vocab, (9, 6, 4))
    moved = _draws(demo, model, vocab, (5, 3, 4), order=(2, 1, 0))
    for key, samples in small.items():
        m = min(len(samples), len(moved[key]))
        assert large[key][:len(samples)] == samples and moved[key][:m] == samples[:m], key
    assert len({tuple(map(tuple, v)) for v in large.values()}) == 3       # the three streams differ
    other_seed, other_name = _draws(demo, model, vocab, (9, 6, 4), seed=1), _draws(demo, model, vocab, (9, 6, 4),
                                                                                 stream="other")
    assert other_seed != large and other_name != large


def t_keyed_rng_is_the_same_stream_in_every_process():
    """core.keyed_rng seeds from the key's text (SHA-512), not Python's salted str hash: a child process with
    another PYTHONHASHSEED draws the same numbers; another key draws others."""
    import subprocess
    import transformer as core
    code = ("import sys; sys.path.insert(0, %r); import transformer as core; "
            "print(core.keyed_rng('sample', 'x', 0, 1.0, None, True, 7).random())" % ROOT)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = core.keyed_rng("sample", "x", 0, 1.0, None, True, 7).random()
    assert float(out.stdout) == here
    assert core.keyed_rng("sample", "x", 0, 1.0, None, True, 8).random() != here
