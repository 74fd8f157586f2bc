"""The experiments' QUICK runs and what they write: every demo script runs with QUICK=1 into a temporary
folder, and the invariants that must hold whatever the seed are asserted on its results file (schemas,
paired items, resumed runs, saved models that reload identically).  Every row of demos/experiments.py has a
``t_<results name>_quick*`` test here (tests/tests_codebase.py checks it).  The pages and the README rendered
from these runs are tested in tests/tests_pages.py; the codebase's own rules in tests/tests_codebase.py.

    python -m pytest tests/tests_studies.py      (or: python tests/tests_studies.py)

The QUICK runs take about two minutes on a 2-core machine; they run once per session and are shared (the
page tests reuse them through ``quick_results``).
"""
import functools
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)

try:
    import pytest
    slow = pytest.mark.slow       # over about 20 s: run by `python -m pytest -m slow` and `make test`
except ImportError:               # the plain runner (python tests_x.py) needs no pytest
    def slow(test):
        return test


def _temp_folder(prefix):
    """A new temporary folder, removed when this test process ends (the QUICK runs are shared by several
    tests, so their folders outlive any one test; each holds up to 11 MB and a copy of the code)."""
    import atexit
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


FROM_CHEMDATA_DIR = ("deepchem_esol", "deepchem_hopv")


"""Demos that quick_run_one runs from a copy of the code whose data/ is empty, with CHEMDATA_DIR set to the
real data folder and downloads off: every reader of the data, DeepChem's included, must honour it."""


def _code_copy_with_empty_data(folder):
    """A copy of the code (top-level *.py, demos/*.py) in folder/checkout with an empty data/; its root."""
    root = os.path.join(folder, "checkout")
    os.makedirs(os.path.join(root, "demos"))
    os.makedirs(os.path.join(root, "data"))
    for path in glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "demos", "*.py")):
        shutil.copyfile(path, os.path.join(root, os.path.relpath(path, ROOT)))
    return root


def _real_data_dir():
    return os.path.abspath(os.environ.get("CHEMDATA_DIR") or os.path.join(ROOT, "data"))


@functools.lru_cache(maxsize=None)
def quick_run_one(script, *args):
    """Run demos/demo_<script>.py with QUICK=1 (and extra command-line ``args``) into its own temporary
    folder, once per session; returns (folder, returncode, log tail).  The chemistry demos use this
    (those in FROM_CHEMDATA_DIR from a copy of the code with an empty data/ folder)."""
    folder = _temp_folder(f"quick-{script}-")
    env = dict(os.environ, QUICK="1", RESULTS_DIR=folder)
    root = ROOT
    if script in FROM_CHEMDATA_DIR:
        root = _code_copy_with_empty_data(folder)
        env.update(CHEMDATA_DIR=_real_data_dir(), CHEMDATA_OFFLINE="1")
    proc = subprocess.run([sys.executable, os.path.join(root, "demos", f"demo_{script}.py"), *args], env=env,
                          cwd=root, capture_output=True, text=True)
    return folder, proc.returncode, proc.stdout[-4000:] + proc.stderr[-4000:]


def quick_results(script, result_name, *args):
    """The ``results`` dict of a QUICK run of one demo, after the checks every payload must pass."""
    folder, rc, log = quick_run_one(script, *args)
    assert rc == 0, f"demo_{script}.py failed:\n{log}"
    with open(os.path.join(folder, f"results_{result_name}.json")) as f:
        payload = json.load(f)
    assert payload["quick"] is True and payload["seed"] == 0 and payload["wall_time_s"] > 0 and payload["git_commit"]
    assert payload["python"] and payload["config"] and payload["mode"] == "quick"
    assert all(payload["matmul_mflops"][k] > 0 for k in ("start", "end"))    # how fast the host was
    checks = payload["results"].get("checks", {})
    failed = [k for k, v in checks.items() if v is not True]
    assert not failed, f"{script}: self-checks failed: {failed}"
    return payload["results"]


def t_attention_quick():
    r = quick_results("attention_basics", "attention")
    for row in r["scaling"]:
        assert 0.8 <= row["scaled_var"] <= 1.2, row
    ent = [row["unscaled_entropy"] for row in r["scaling"]]
    assert all(a > b for a, b in zip(ent, ent[1:])), ent
    assert all(g["n_failed"] == 0 for g in r["gradient_check"])
    assert abs(r["stability"]["sum"] - 1.0) < 1e-12
    ffn = next(g for g in r["gradient_check"] if g["module"] == "FeedForward")
    assert ffn["n_params"] == 297                          # the tutorial's count: d = 8, d_ff = 17
    for row in r["scaling"]:                               # within-row variance ~ 15/16 of the pooled one
        assert 0.8 < row["scaled_within_row_var"] / row["scaled_var"] < 1.05, row
    for key in ("qk", "mha"):                              # residual ratios are fit / measured, one per T
        assert len(r["cost_fit"][key]["power_fit"]["ratio_fit_over_measured"]) == len(r["cost"])


def quick_section(script, result_name, *args):
    """render_section of the QUICK run of one demo (the one quick_results checked)."""
    with open(os.path.join(quick_run_one(script, *args)[0], f"results_{result_name}.json"), encoding="utf-8") as f:
        return render_section(result_name, json.load(f))


def unwrapped(text):
    """Markdown text with its line breaks and runs of spaces as single spaces (pages wrap their prose)."""
    return " ".join(text.split())


def render_section(name, payload):
    """Draw every figure of one experiment's report into a temporary folder (each must be a real file) and
    return its page (docs/<page>.md) as text."""
    import report_kit
    module = report(name)
    with tempfile.TemporaryDirectory() as d:
        for fn in module.FIGURES:
            for path in fn(payload, payload["results"], d):
                assert os.path.getsize(path) > 1000, path
    return report_kit.render_page(experiments.by_results(name), module, payload)


def report(results_name):
    """The report module of a registry row (demos/report_<script>.py), by its results name."""
    import importlib
    return importlib.import_module("report_" + experiments.by_results(results_name).script)


def t_positional_quick():
    r = quick_results("positional", "positional")
    idt = r["identities"]
    for key in ("addition_max_err", "inner_spread_max", "inner_max_dev", "rope_max_rel_change"):
        assert idt[key] < 1e-12, (key, idt[key])
    change = {row["pos"]: row["rel_change"] for row in r["permutation"]}
    assert change["none"] < 1e-12
    assert all(change[p] > 1e-3 for p in ("sine", "learned", "rope")), change
    esol = {row["pos"]: row for row in r["permutation_esol"]}          # real molecules, atom tokens
    assert r["permutation_esol_data"]["n_used"] > 0 and esol["none"]["max_abs_change"] < 1e-12
    assert all(esol[p]["mean_abs_change"] > 1e-4 for p in ("sine", "learned", "rope"))
    adj = r["ladder"]["adjacent_curve"]                    # binary steps are sqrt(flipped bits), sine constant
    assert {round(x["binary"] ** 2, 9) for x in adj} <= {float(k) for k in range(1, 9)}
    assert max(x["sine"] for x in adj) - min(x["sine"] for x in adj) < 1e-12


def t_tokenization_quick():
    r = quick_results("tokenization", "tokenization")
    for s in r["schemes"]:
        assert s["decodable_fraction"] == 1.0, s["scheme"]
        if s["kind"] == "bpe":                             # the ledger against an independent count
            assert s["n_initial_tokens"] == s["n_initial_tokens_independent"]
            assert s["sum_gains"] == s["n_initial_tokens_independent"] - s["train_tokens_encoded"]
            assert s["distinct_tokens_used_all"] <= s["vocab"]
            if s["criterion"] == "gain":
                assert s["rank_greedy_mismatches_train"] == 0
    rules = {(s["merges_requested"], s["end_of_word"]): set() for s in r["schemes"] if s["kind"] == "bpe"}
    for s in r["schemes"]:
        if s["kind"] == "bpe":
            rules[(s["merges_requested"], s["end_of_word"])].add(s["criterion"])
    assert all(v == {"gain", "count"} for v in rules.values()), rules   # every BPE row under both rules
    top = r["top_subwords_count"][0]
    assert top["count"] >= top["gain"] and {"caffeine", "caffeine_kekule"} <= set(r["examples"])


def t_dropout_quick():
    r = quick_results("dropout", "dropout")
    for row in r["dropout"]:
        assert row["masked_mean_abs"] == 0.0 and row["masked_nonzero_count"] == 0
        first = row["context_rel_noise"][0]                # row 0 has one weight: its noise IS sqrt(p/(1-p))
        assert abs(first["closed_form"] - row["noise_scale_closed_form"]) < 1e-12
        for c in row["context_rel_noise"]:
            assert abs(c["measured"] / c["closed_form"] - 1) < 0.1, c


@slow
def t_length_generalization_quick():
    r = quick_results("length_generalization", "length_generalization")
    assert set(r["tasks"]) == {"periodic", "mirror"}          # default/QUICK: the tutorial's two tasks
    per = r["tasks"]["periodic"]
    L0 = r["train_length"]
    sine = {x["length"]: x["accuracy"] for x in per["accuracy"]["sine"]}
    assert sine[L0] > 2 * per["chance"], sine[L0]            # even 60 QUICK steps learn part of the rule
    for pos, rows in per["accuracy_all_targets"].items():   # all targets = counted + the 2 unpredictable
        counted = {x["length"]: x for x in per["accuracy"][pos]}
        for x in rows:
            assert x["n_targets"] == counted[x["length"]]["n_targets"] + 2 * x["n_sequences"], x
    for rows in r["tasks"]["mirror"]["accuracy"].values():  # the mirrored half, n = L / 2 targets each
        for x in rows:
            assert x["n_targets"] == x["length"] // 2 * x["n_sequences"] and len(x["accuracy_by_k"]) == x["length"] // 2
    for tr in r["tasks"].values():
        assert all(set(c) >= {"converged", "reason"} for c in tr["convergence"].values())


_FAKE_DEMO = '''"""A stand-in experiment for the run_all tests: FAKE_FAIL_<name> fails it, FAKE_SLEEP_<name> makes it
touch that file and then sleep (so the test can interrupt it)."""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common
NAME = os.path.basename(__file__)[5:-3]
args, config, run = common.start(NAME, __doc__, {"size": 3}, {"size": 1})
if os.environ.get("FAKE_FAIL_" + NAME):
    sys.exit(3)
marker = os.environ.get("FAKE_SLEEP_" + NAME)
if marker:
    open(marker, "w").close()
    time.sleep(60)
run.finish({"extended": run.extended, "checks": {"ok": True}})
'''


def _fake_checkout(folder, names=("attention_basics", "positional", "dropout"), extra=None):
    """A throwaway git checkout holding run_all.py, common.py, experiments.py, transformer.py, safe_io.py,
    chemdata.py and fake demos (plus ``extra`` {relative path: text} files), committed."""
    os.makedirs(os.path.join(folder, "demos"))
    for rel, text in (extra or {}).items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "w", encoding="utf-8") as g:
            g.write(text)
    for rel in ("demos/run_all.py", "demos/common.py", "demos/experiments.py", "transformer.py", "safe_io.py",
                "chemdata.py"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f, \
                open(os.path.join(folder, rel), "w", encoding="utf-8") as g:
            g.write(f.read())
    for name in names:
        with open(os.path.join(folder, "demos", f"demo_{name}.py"), "w", encoding="utf-8") as g:
            g.write(_FAKE_DEMO)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "fake"]):
        subprocess.run(git + cmd, cwd=folder, check=True, capture_output=True)


def _reaction():
    """QUICK results of experiment 9 (a tiny model on 20 reactions) and the folder they were written to."""
    return quick_results("reaction_seq2seq", "reaction"), quick_run_one("reaction_seq2seq")[0]


@slow
def t_reaction_quick_schema():
    r, _ = _reaction()
    ref = r["runs"]["reference"]
    assert ref["n_train"] == 20 and ref["params"] == ref["params_formula"] and ref["vocab_size"] > 4
    assert set(r["baselines"]) == {"copy_largest", "nearest_train", "nearest_train_all"}
    blocks = list(ref["metrics"].values()) + list(r["baselines"].values())
    for b in blocks:
        assert {"test500", "test150", "by_class"} <= set(b)
        m = b["test500"]
        assert {"n", "top1", "top3", "top5", "valid", "tanimoto", "conserved"} <= set(m)
        assert 0 <= m["top1"] <= m["top3"] <= m["top5"] <= 1 and 0 <= m["tanimoto"] <= 1
    n = r["data"]["n_test_used"]
    assert len(r["predictions"]) == n and sum(b["n"] for b in ref["metrics"]["beam5"]["by_class"].values()) == n
    for p in r["predictions"]:
        assert {"row", "class", "source", "product", "reference", "copy_largest", "nearest_train"} <= set(p)
        assert 1 <= len(p["reference"]["beam"]) <= 5 and all(isinstance(s, str) for s in p["reference"]["beam"])
    assert [x["width"] for x in ref["topk_vs_width"]] == [1, 3, 5]          # width 10 only in --extended
    # QUICK decodes the constrained beam (the default run leaves it to --extended) on the sweep's reactions
    assert ref["constrained"]["available"] and ref["metrics"]["beam5_constrained"]["test500"]["n"] == ref["n_sweep"]
    assert len(ref["epochs"]) == 1 and all("valid_token_acc" in e for e in ref["epochs"])
    # the copy baseline's top-1 is a reactant: always valid and always passes the atom check
    assert r["baselines"]["copy_largest"]["test500"]["valid"] == 1.0
    assert r["baselines"]["copy_largest"]["test500"]["conserved"] == 1.0
    # the recipe: samples per step and warmup as configured; paired comparisons over the same reactions
    assert ref["train_settings"]["batch_size"] == 2 and ref["n_steps"] == 10
    cmp = r["comparisons"]
    assert {(c["split"], c["b"]) for c in cmp} == {(s, b) for s in ("test150", "test500")
                                                   for b in ("copy_largest", "nearest_train")}
    assert all(c["verdict"] in ("lower", "higher", "level") and c["ci_low"] <= c["diff"] <= c["ci_high"]
               for c in cmp)
    tan = next(c for c in cmp if c["split"] == "test500" and c["b"] == "copy_largest" and c["metric"] == "tanimoto")
    copy = r["baselines"]["copy_largest"]["test500"]["tanimoto"]
    assert abs(tan["diff"] - (ref["metrics"]["beam5"]["test500"]["tanimoto"] - copy)) < 1e-12
    closer = ref["closer_to_product"]["greedy"]["test500"]
    assert closer["n"] == n and 0 <= closer["closer"] <= closer["n_valid"] <= n


@slow
def t_reaction_canonical_match_counts_a_reordered_product():
    r, _ = _reaction()
    assert r["reorder_check"]["all_hits"] and r["reorder_check"]["n_spelled_differently"] > 0


@slow
def t_reaction_beam_width_1_equals_greedy():
    r, _ = _reaction()
    ref = r["runs"]["reference"]
    assert ref["beam1_equals_greedy"] == ref["n_sweep"] > 0


@slow
def t_reaction_no_reaction_in_two_splits():
    r, _ = _reaction()
    assert r["splits_overlap"] == 0 and r["checks"]["no_reaction_in_two_splits"]


@slow
def t_reaction_saved_model_reloads_and_decodes_identically():
    import transformer as core
    import chemdata as cd
    r, folder = _reaction()
    assert r["runs"]["reference"]["reload"] == {"n": 2, "same_logits": True, "same_greedy": True}
    path = os.path.join(folder, "models", "reaction_seq2seq.json")
    model = core.load_model(path)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)["meta"]
    vocab = cd.Vocab(meta["vocab"][len(cd.Vocab.SPECIALS):])
    for p in r["predictions"][:3]:                  # the reloaded model reproduces the run's greedy strings
        src = vocab.encode(cd.tokenize_smiles(p["source"]))
        ids = core.greedy_decode(model, [vocab.bos_id], meta["max_new_tokens"], src=src, eos_id=vocab.eos_id)
        assert "".join(vocab.decode(ids)) == p["reference"]["greedy"]


@slow
def t_reaction_extended_quick_has_the_strong_run():
    r = quick_results("reaction_seq2seq", "reaction", "--extended")
    assert set(r["runs"]) == {"reference", "strong"}
    assert r["runs"]["strong"]["config"]["label_smoothing"] > 0 and r["checks"]["strong_reload_decodes_identically"]
    assert all("strong" in p for p in r["predictions"])


def t_reaction_rescore_reproduces_the_run_and_records_the_call():
    """--rescore recomputes, from the stored predictions, exactly the comparisons the QUICK run stored, and the
    call is recorded under the payload's updates (what, commit, wall time)."""
    _reaction()
    folder = tempfile.mkdtemp(prefix="rescore-reaction-")
    shutil.copyfile(os.path.join(quick_run_one("reaction_seq2seq")[0], "results_reaction.json"),
                    os.path.join(folder, "results_reaction.json"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", "demo_reaction_seq2seq.py"), "--rescore",
                           "--out", folder], env=dict(os.environ, QUICK="1"), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(folder, "results_reaction.json"), encoding="utf-8") as f:
        after = json.load(f)
    assert after["results"]["comparisons"] == _reaction()[0]["comparisons"]
    (u,) = after["updates"]
    assert "recomputed from the stored predictions" in u["what"] and u["git_commit"] and u["wall_time_s"] > 0


def t_reaction_committed_comparisons_pair_the_same_reactions():
    """In the committed results of experiment 9, a Tanimoto 'over valid predictions' comparison is over the
    reactions whose Transformer top-1 is valid, on BOTH sides: its items are exactly those reactions (checked
    with RDKit on the stored greedy strings of the tutorial's row), and copy's mean is over the same items.
    (Before the pairing rule the copy side was averaged over all 150.)"""
    import chemdata as cd
    import reactions
    r = _committed("reaction")
    c = next(c for c in r["comparisons"] if (c["a"], c["b"], c["metric"], c["split"]) == (
        "Transformer, reference, greedy", "copy_largest", "tanimoto_valid", "test150"))
    preds = r["predictions"][:150]
    valid = [p["row"] for p in preds if cd.is_valid_smiles(p["reference"]["greedy"])]
    assert c["items"] == valid and c["n_items"] == len(valid) == c["n_scored_a"] < c["n_scored_b"] == 150
    copy = {p["row"]: reactions.product_tanimoto(p["copy_largest"][0], p["product"]) for p in preds}
    assert abs(c["mean_b"] - sum(copy[i] for i in valid) / len(valid)) < 1e-12
    assert abs(c["mean_a"] - r["runs"]["reference"]["metrics"]["greedy"]["test150"]["tanimoto_valid"]) < 1e-12
    for c in r["comparisons"]:                               # every record says how many items each side scored
        assert c["n_items"] <= min(c["n_scored_a"], c["n_scored_b"]) and len(c.get("items", [0] * c["n_items"])) \
            == c["n_items"], c


def t_reaction_smoothed_floor_is_the_minimum_of_the_smoothed_loss():
    """The floor drawn for a label-smoothed run is the smoothed cross-entropy at p = q (zero gradient there) and
    below it anywhere else."""
    import transformer as core
    import report_reaction_seq2seq as rr
    V, eps = 7, 0.1
    q = [(1 - eps) * (k == 2) + eps / V for k in range(V)]
    loss, grad = core.cross_entropy_rows([[math.log(x) for x in q]], [2], label_smoothing=eps)
    assert abs(loss - rr.smoothed_floor(V, eps)) < 1e-12 and max(abs(g) for g in grad[0]) < 1e-12
    assert core.cross_entropy_rows([[0.0] * V], [2], label_smoothing=eps)[0] > rr.smoothed_floor(V, eps) + 0.1
    assert rr.smoothed_floor(V, 0.0) == 0.0


def _committed(name):
    """The results of the committed figures/results_<name>.json."""
    with open(os.path.join(ROOT, "figures", f"results_{name}.json"), encoding="utf-8") as f:
        return json.load(f)["results"]


@slow
def t_graduate_torch_quick_extended():
    """QUICK --extended run of demos/demo_graduate_torch.py (tiny models; about a minute on 2 cores): (a) the
    speed rows, (b) the torch run's losses equal the pure-Python ones to 1e-9 and torch's beam search equals
    ours on from_torch(module), (c) a scored scale curve with every test reaction's predictions and the
    calibration row; then its figures and README section.  Needs torch (skipped, saying so, without it)."""
    try:
        import torch  # noqa: F401  (imported only to see whether it can be)
    except ImportError:
        print("t_graduate_torch_quick_extended: skipped, torch is not installed")
        return
    r = quick_results("graduate_torch", "graduate_torch", "--extended")
    assert set(r["speed"]) == {"reference", "lm_d48"}
    for x in r["speed"].values():
        assert x["pure_python_s_per_step"] > 0 and x["torch64_s_per_step"] > 0 and x["ratio64"] > 0
    rep = r["reproduce"]
    assert rep["n_match"] >= 3 and rep["max_abs_loss_diff_first_n"] <= 1e-9
    assert r["beam_check"]["same_top_beam"] == r["beam_check"]["n"] > 0
    pts = r["scale"]["points"]
    assert pts and all(p["steps"] > 0 and set(p["metrics"]) == {"greedy", "beam5"} for p in pts)
    assert [p["train_minutes"] for p in pts] == sorted(p["train_minutes"] for p in pts)
    assert r["calibration"]["steps"] > 0 and "greedy" in r["calibration"]["metrics"]
    comps = r["scale"]["comparisons"]                                   # the last point against copy, paired
    assert {(c["a"], c["metric"]) for c in comps} >= {("torch scale, beam5", "tanimoto"),
                                                      ("torch scale, greedy", "top1")}
    assert all(c["b"] == "copy_largest" and c["n_items"] == (c["n_scored_a"] if c["metric"] == "tanimoto_valid" else
                                                             len(r["predictions"])) and c["ci_low"] <= c["diff"]
               <= c["ci_high"] and c["verdict"] in ("lower", "higher", "level") for c in comps), comps
    assert all(p["scale_final"]["beam"] and p["same_size_final"]["beam"] and "product" in p for p in r["predictions"])
    assert any("scale" in k for k in r["predictions"][0]), r["predictions"][0].keys()
    ss = r["same_size"]                                   # experiment 9's model size, the wide curve's recipe
    assert ss["points"] and ss["config"]["batch_size"] == r["scale"]["config"]["batch_size"] and ss["params"] < r[
        "scale"]["params"] and {c["metric"] for c in ss["against_scale"]} == {"top1", "tanimoto"}
    for curve in (r["scale"], ss):
        _check_outcomes(curve, len(r["predictions"]))
    text = quick_section("graduate_torch", "graduate_torch", "--extended")
    assert "## Reading" in text and "stretch target" in text and text.count("\n| ") >= 6, text


def _check_outcomes(curve, n):
    """A curve's outcome split adds up: its parts cover the n test reactions, the exact hits are its beam-5
    top-1 share, and the parts' Tanimoto (and copy's) average back to the point's (and copy's) means."""
    o, m, copy = curve["outcomes"], curve["points"][-1]["metrics"]["beam5"], curve["baselines"]["copy_largest"]
    parts = ("exact", "valid_wrong", "invalid")
    assert sum(o[k]["n"] for k in parts) == o["n"] == n and o["exact"]["n"] == round(m["top1"] * n)
    assert o["exact"]["n"] + o["valid_wrong"]["n"] == round(m["valid"] * n)
    for key, whole in (("tanimoto", m["tanimoto"]), ("copy_tanimoto", copy["tanimoto"])):
        assert abs(sum(o[k]["n"] * (o[k][key] or 0.0) for k in parts) / n - whole) < 1e-9, (key, o, whole)
    c = o["valid_wrong"].get("comparison")
    assert c is None or (c["n_items"] == o["valid_wrong"]["n"] and abs(c["mean_a"] - o["valid_wrong"]["tanimoto"])
                         < 1e-12 and abs(c["mean_b"] - o["valid_wrong"]["copy_tanimoto"]) < 1e-12)


def t_graduate_add_same_size_updates_an_existing_file_and_rescores_it_unchanged():
    """--add-same-size on a results file without the same-size curve (the QUICK run's, stripped of it) trains and
    scores that curve into it, records the call under updates, and recomputes the wide curve's comparisons and
    outcome split from the stored predictions exactly as the run stored them."""
    try:
        import torch  # noqa: F401  (imported only to see whether it can be)
    except ImportError:
        print("t_graduate_add_same_size_updates_an_existing_file_and_rescores_it_unchanged: skipped, no torch")
        return
    r = quick_results("graduate_torch", "graduate_torch", "--extended")
    folder = tempfile.mkdtemp(prefix="add-same-size-")
    with open(os.path.join(quick_run_one("graduate_torch", "--extended")[0], "results_graduate_torch.json"),
              encoding="utf-8") as f:
        payload = json.load(f)
    del payload["results"]["same_size"]
    for p in payload["results"]["predictions"]:
        for k in [k for k in p if k.startswith("same_size")]:
            del p[k]
    with open(os.path.join(folder, "results_graduate_torch.json"), "w", encoding="utf-8") as f:
        json.dump(payload, f)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", "demo_graduate_torch.py"), "--add-same-size",
                           "--out", folder], env=dict(os.environ, QUICK="1"), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(folder, "results_graduate_torch.json"), encoding="utf-8") as f:
        after = json.load(f)
    a = after["results"]
    assert a["same_size"]["points"] and a["same_size"]["against_scale"] and "same_size" in after["config"]
    assert all(p["same_size_final"]["beam"] for p in a["predictions"])
    assert a["scale"]["comparisons"] == r["scale"]["comparisons"] and a["scale"]["outcomes"] == r["scale"]["outcomes"]
    (u,) = after["updates"]
    assert "same-size curve" in u["what"] and u["wall_time_s"] > 0 and u["git_commit"]


def t_graduate_committed_outcome_split_adds_up():
    """The committed scale curve's final point, split by outcome, adds up to its beam-5 top-1, validity and mean
    Tanimoto (and copy's), and its paired test on the valid but wrong reactions is over exactly those."""
    r = _committed("graduate_torch")
    for name in ("scale", "same_size"):
        if name in r:
            _check_outcomes(r[name], len(r["predictions"]))


RUN_KEYS = {"split", "model", "seed", "metrics", "test_ids", "y_true", "y_pred"}


def _property(name, *args):
    """(results, folder) of a QUICK run of one property demo (name: its results name)."""
    script = experiments.by_results(name).script
    return quick_results(script, name, *args), quick_run_one(script, *args)[0]


def _check_property_runs(r):
    """Schema, lengths = split sizes, metrics recomputed from the stored predictions, mean baseline R² = 0."""
    import evaluation
    for key in ("data", "splits", "runs", "summary", "curves", "saved_model", "checks"):
        assert key in r, key
    for run in r["runs"]:
        assert RUN_KEYS <= set(run), set(run)
        n = r["splits"][run["split"]]["sizes"][2]
        assert len(run["y_true"]) == len(run["y_pred"]) == len(run["test_ids"]) == n
        t = run["metrics"]["test"]
        assert abs(evaluation.rmse(run["y_true"], run["y_pred"]) - t["rmse"]) < 1e-12
        assert abs(evaluation.mae(run["y_true"], run["y_pred"]) - t["mae"]) < 1e-12
        assert abs(evaluation.r2(run["y_true"], run["y_pred"]) - t["r2"]) < 1e-12
        if run["model"] == "mean":
            assert abs(run["metrics"]["train"]["r2"]) < 1e-12 and t["pearson"] is None
    models = {run["model"] for run in r["runs"]}
    assert {"Transformer", "mean"} <= models


def _check_saved_predictor(folder, name, inputs):
    import predictor
    pred = predictor.load_predictor(os.path.join(folder, f"{name}_transformer.json"))
    values = pred.predict(inputs)
    assert all(isinstance(v, float) for v in values[:-1]) and values[-1] is None
    for key in ("tokenizer", "vocab_tokens", "target_mean", "target_std", "units", "task", "train_data_sha256"):
        assert key in pred.meta, key


def _fake_runs(model, seeds, y, shift, noise=0.0, ids=None):
    import random
    rng = random.Random(len(model))
    return [{"split": "random", "model": model, "seed": s, "test_ids": ids or list(range(len(y))), "y_true": y,
             "y_pred": [v + shift + rng.gauss(0, noise) for v in y]} for s in seeds]


def t_best_epoch_against_last_epoch_is_paired_within_each_seed():
    """property_common.per_seed_comparisons (experiment 6's best-vs-last-epoch reading): one paired bootstrap
    per seed over that seed's own test items, so a gap inside one training is judged by its own interval and
    never by the spread between seeds; identical predictions are 'same'; a seed whose two rows name other
    items raises ValueError; a seed run by one side only is left out."""
    import property_common as pc
    y = [0.1 * i for i in range(40)]
    last = _fake_runs("last", [0, 1, 2], y, 0.5)                                    # every error +0.5
    best = [dict(r, model="best", y_pred=[v + d for v in r["y_pred"]]) for r, d in zip(last, (0.0, -0.3, 0.4))]
    out = pc.per_seed_comparisons(best + last + _fake_runs("best", [7], y, 0.0), "random", "best", "last")
    assert [c["seed"] for c in out] == [0, 1, 2] and all(c["n_items"] == 40 for c in out)
    assert [c["verdict"] for c in out] == ["same", "lower", "higher"], out
    assert abs(out[1]["diff"] + 0.3) < 1e-9 and abs(out[2]["diff"] - 0.4) < 1e-9
    assert all(c["ci_low"] <= c["diff"] <= c["ci_high"] and "within the seed" in c["rule"] for c in out)
    moved = [dict(last[0], test_ids=list(range(1, 41)))]
    try:
        pc.per_seed_comparisons(best[:1] + moved, "random", "best", "last")
    except ValueError as e:
        assert "other test items" in str(e)
    else:
        raise AssertionError("a seed whose rows name other items must raise")


def t_comparison_verdicts_and_item_check():
    """property_common.comparison: identical runs are level with [0, 0]; a constant offset is the diff and
    'higher'; a gap inside the seed spread is 'level' although its interval excludes 0; runs naming other
    test items (or another order) raise ValueError."""
    import property_common as pc
    y = [0.1 * i for i in range(40)]
    base = _fake_runs("B", [0], y, 0.0)
    same = pc.comparison(base, base, "rmse", "random")
    assert (same["verdict"], same["ci_low"], same["ci_high"], same["diff"]) == ("level", 0.0, 0.0, 0.0)
    off = pc.comparison(_fake_runs("A", [0, 1, 2], y, 0.5), base, "rmse", "random")
    assert off["verdict"] == "higher" and abs(off["diff"] - 0.5) < 1e-12 and off["n_items"] == 40
    assert {"a", "b", "metric", "split", "diff", "ci_low", "ci_high", "n_items", "verdict"} <= set(off)
    spread = [dict(r, y_pred=[v + s for v in y]) for r, s in zip(_fake_runs("A", [0, 1, 2], y, 0), (0.1, 0.2, 1.2))]
    wide = pc.comparison(spread, base, "mae", "random")
    assert wide["ci_low"] > 0 and wide["seed_spread_rule_level"] and wide["verdict"] == "level", wide
    other = _fake_runs("C", [0], y, 0.0, ids=list(range(1, 41)))
    try:
        pc.comparison(other, base, "rmse", "random")
    except ValueError as e:
        assert "other test items" in str(e)
    else:
        raise AssertionError("runs with other test_ids were compared")


def t_best_epoch_picks_the_minimum_with_patience():
    """Early stopping on a synthetic validation curve: the global minimum without patience, the minimum
    seen before `patience` epochs without improvement with it; EpochSnapshots restores that epoch's weights."""
    import property_common as pc
    curve = [{"epoch": e + 1, "valid_rmse": v} for e, v in enumerate([1.0, 0.8, 0.7, 0.75, 0.72, 0.6, 0.9])]
    assert pc.best_epoch(curve) == {"epoch": 6, "value": 0.6, "stopped_at": 7, "patience": None}
    assert pc.best_epoch(curve, patience=2) == {"epoch": 3, "value": 0.7, "stopped_at": 5, "patience": 2}
    assert pc.best_epoch(curve, patience=3)["epoch"] == 6
    for bad in (0, 1.5):
        try:
            pc.best_epoch(curve, patience=bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"patience {bad!r} accepted")
    core = pc.core
    model = core.TransformerEncoder(8, d_model=8, n_heads=2, n_layers=1, max_len=8, pad_id=0, seed=0)
    snaps = pc.EpochSnapshots()
    before = [[list(r) for r in p.rows()] for p in model.params()]
    snaps(model, 1)
    for p in model.params():
        for row in p.rows():
            row[:] = [v + 1.0 for v in row]
    assert snaps.restore(model, 1) and [[list(r) for r in p.rows()] for p in model.params()] == before
    assert not snaps.restore(model, 2)


def t_best_epoch_survives_a_resumed_training():
    """A training that finished before a resumed call (the checkpoint is at its last step) still puts its
    best epoch back: the epoch snapshots are kept beside the checkpoint and read back with it, so the
    resumed call selects the same epoch and predicts the same values; a fresh training ignores them."""
    import random
    import property_common as pc
    rng = random.Random(0)
    ids = {part: [[rng.randrange(1, 8) for _ in range(rng.randrange(2, 6))] for _ in range(n)]
           for part, n in (("train", 24), ("valid", 8), ("test", 8))}
    y = {part: [len(x) + 0.1 * x[0] for x in v] for part, v in ids.items()}
    cfg = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=8, epochs=4, batch_size=4, lr=3e-3, warmup=2)
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "t.json")
        runs = [pc.train_encoder(ids, y, cfg, seed=0, tag="t", vocab_size=8, pad_id=0, checkpoint=ck, workers=1,
                                 log=lambda *a: None, keep_best=True) for _ in range(2)]
        with open(os.path.join(d, "t.epochs.json"), encoding="utf-8") as f:
            assert sorted(json.load(f)) == ["1", "2", "3", "4"]
        assert runs[1]["history"]["resumed_at_steps"], "the second call did not resume"
        a, b = (r["best"] for r in runs)
        assert b["restored"] and (a["epoch"], a["value"], a["preds"]) == (b["epoch"], b["value"], b["preds"])
        kept = pc.EpochSnapshots(os.path.join(d, "t.epochs.json"), resume=True)   # a non-last epoch too
        assert kept.restore(runs[1]["model"], 1) and kept.snaps[1] == [[list(r) for r in p.rows()]
                                                                       for p in runs[1]["model"].params()]
        fresh = pc.EpochSnapshots(os.path.join(d, "t.epochs.json"), resume=False)
        assert fresh.snaps == {} and not fresh.restore(runs[1]["model"], 1)


@slow
def t_esol_quick():
    r, folder = _property("esol")
    _check_property_runs(r)
    models = {run["model"] for run in r["runs"]}
    assert {"ridge + fingerprints", "ESOL equation (published, fitted on all molecules)", "ESOL equation (refit)",
            "Transformer (best valid epoch)"} <= models
    assert set(r["splits"]) == {"scaffold", "random"}
    for split in r["splits"]:       # every model of a split names the same test items, in the same order
        assert len({tuple(x["test_ids"]) for x in r["runs"] if x["split"] == split}) == 1, split
    assert all("test_bias" in x for x in r["runs"])
    best = [x for x in r["runs"] if x["model"] == "Transformer (best valid epoch)"]
    assert all(1 <= x["epoch"] <= r["transformer"]["config"]["epochs"] for x in best)
    cmp_keys = {"a", "b", "metric", "split", "diff", "ci_low", "ci_high", "n_items", "verdict"}
    assert r["comparisons"] and all(cmp_keys <= set(c) and c["verdict"] in ("lower", "higher", "level")
                                    and c["ci_low"] <= c["ci_high"] for c in r["comparisons"])
    dc = r["deepchem_check"]
    if os.environ.get("REQUIRE_CHEM", "").strip().lower() in ("1", "true", "yes"):
        assert dc.get("available"), f"REQUIRE_CHEM=1 but the demo could not use DeepChem: {dc.get('reason')}"
    if dc.get("available"):
        assert "MLP + fingerprints" in models
        assert dc["smiles_equal"] and dc["scaffold_split_equal"] and dc["deepchem_scaffold_sizes"] == [902, 113, 113]
    else:
        assert r["mlp"]["skipped"]
    _check_saved_predictor(folder, "esol", ["CCO", "c1ccccc1O", "C%%"])
    assert {c["seed"] for c in r["comparisons_within_seed"]} == set(r["seeds"])     # best vs last epoch, per seed


@slow
def t_hopv_quick():
    r, folder = _property("hopv")
    _check_property_runs(r)
    _check_comparisons(r, {("random", "Transformer", "mean", "rmse")})
    ridge = next(run for run in r["runs"] if run["model"] == "ridge + element fractions")
    assert ridge["alpha"] in ridge["alpha_grid"] and 0 <= ridge["test_pred_std_ratio"]
    cfg = r["transformer"]["config"]
    assert r["transformer"]["recipe"]["steps"] == -(-186 // cfg["batch_size"]) * cfg["epochs"]
    assert r["data"]["info"]["n_dropped"] == 117 and r["splits"]["random"]["sizes"] == [186, 23, 24]
    assert r["checks"]["no_molecule_in_two_splits"]
    assert r["data"]["token_lengths"]["max"] >= r["data"]["token_lengths"]["mean"] > 10
    _check_saved_predictor(folder, "hopv", ["c1ccsc1", "C1=CC=CS1", "c1cc sc1"])


@slow
def t_materials_quick_extended():
    r, folder = _property("materials", "--extended")
    _check_property_runs(r)
    assert set(r["splits"]) == {"tutorial", "random", "group"}
    assert all(r["checks"].values()), r["checks"]
    assert r["checks"]["group_split_no_formula_in_two_splits"] is True
    assert (r["data"]["profiles"]["tutorial_slice"]["n"] == 16_000
            and r["data"]["profiles"]["whole_file"]["n"] == 132_752)
    rec = r["transformer"]["recipe"]
    assert rec["steps"] == rec["steps_per_epoch"] * r["transformer"]["config"]["epochs"]
    _check_comparisons(r, {("tutorial", "Transformer", "ridge + element fractions", "rmse"),
                           ("random", "Transformer", "ridge + element fractions", "mae")})
    assert r["splits"]["group"]["test_formulas_in_train"] == 0
    models = {run["model"] for run in r["runs"]}
    assert "Transformer + order augmentation" in models and len(r["seeds"]) >= 2
    priors = [run for run in r["runs"] if run["model"] == "Transformer + periodic-table priors"]
    assert {run["split"] for run in priors} == {"random", "group"}
    plain = next(run for run in r["runs"] if run["model"] == "Transformer" and run["split"] == priors[0]["split"])
    assert priors[0]["n_params"] == plain["n_params"] + 8 * 16      # + W_f (8 element features x d)
    for x in r["order_sensitivity"]:
        assert x["mean_abs_change"] >= 0
    att = r["attention"]
    assert len(att["matrix"]) == len(att["elements"]) and abs(sum(att["share_of_element_queries"].values()) - 1) < 1e-6
    _check_saved_predictor(folder, "materials", ["Fe2O3", "Mg2Si", "Xx"])


def _check_comparisons(r, expected):
    """results.comparisons: the records the readings are built from, with the expected (split, a, b, metric)."""
    got = {(c["split"], c["a"], c["b"], c["metric"]): c for c in r["comparisons"]}
    assert expected <= set(got), sorted(got)
    for c in got.values():
        assert c["verdict"] in ("lower", "higher", "level") and c["ci_low"] <= c["ci_high"], c
        assert c["n_items"] == r["splits"][c["split"]]["sizes"][2]
        if c["verdict"] != "level":
            assert (c["ci_high"] < 0) if c["verdict"] == "lower" else (c["ci_low"] > 0), c


def _smiles_lm():
    """(results, folder) of the QUICK default run of experiment 4."""
    return quick_results("smiles_lm", "smiles_lm"), quick_run_one("smiles_lm")[0]


@slow
def t_smiles_lm_quick_schema():
    r, _ = _smiles_lm()
    assert set(r["fit"]) >= {"train", "valid", "test", "test_buckets"} and len(r["fit"]["test_buckets"]) == 4
    for split in ("train", "valid", "test"):
        f = r["fit"][split]
        assert 0 < f["bits_per_token"] < 10 and abs(f["perplexity"] - 2 ** f["bits_per_token"]) < 1e-9
    assert sum(b["n_tokens"] for b in r["fit"]["test_buckets"]) == r["fit"]["test"]["n_tokens"]
    assert len(r["sampling"]) == 16 and sum(x["constrained"] for x in r["sampling"]) == 8
    for x in r["sampling"] + r["ngram"]["sampling"]:
        assert len(x["samples"]) == len(x["stop_reasons"]) == len(x["n_tokens"]) == x["n"]
        assert 0 <= x["uniqueness"] <= x["validity"] <= 1 and x["tokens_per_s"] > 0
        assert sum(x["failures"].values()) == x["n"] - x["n_valid"]
        assert x["failures"]["no_eos"] == sum(why != "eos" for why in x["stop_reasons"])
        headline = (x["temperature"], x["top_k"]) in {tuple(h) for h in r["sampling_sizes"]["headline_settings"]}
        assert x["n"] == r["sampling_sizes"]["ngram" if x in r["ngram"]["sampling"] else
                                             "headline" if headline else "other"]
    assert len(r["ngram"]["sampling"]) == 4 and 2 <= r["ngram"]["n"] <= 20   # fit_ngram: n in 2..20
    assert r["speed"]["identical"] and r["speed"]["cached"]["tokens_per_s"] > 0
    assert r["history"]["epochs"] and r["history"]["steps"] and r["reading"] and all(r["checks"].values())
    d = r["distribution"]
    if os.environ.get("REQUIRE_CHEM", "").strip().lower() in ("1", "true", "yes"):
        assert d["available"], d
    if d["available"]:
        assert set(d["versions"]) == {"guacamol", "fcd"} and len(d["rows"]) == 8 + 2
        assert {x["source"] for x in d["rows"]} == {"Transformer", "n-gram", "training (resampled)", "test split"}
        test = next(x for x in d["rows"] if x["source"] == "test split")     # every row also at the test's size
        assert test["kl_at_size"]["repeats"] == 1 and test["kl_at_size"]["mean"] == test["kl"]["score"]
        assert all(x["kl_at_size"]["size"] <= test["kl_at_size"]["size"] for x in d["rows"])


@slow
def t_smiles_lm_validity_rescored_from_stored_samples():
    import chemdata as cd
    import generation_metrics
    import smiles_grammar
    r, _ = _smiles_lm()
    assert not cd.is_valid_smiles("C1CC") and smiles_grammar.smiles_failure_reason("C1CC") == "unclosed_ring"
    for x in r["sampling"]:                 # a sample without <eos> is invalid (no_eos) whatever RDKit says
        valid = sum(bool(s) and "<unk>" not in s and why == "eos" and cd.canonical_smiles(s) is not None
                    for s, why in zip(x["samples"], x["stop_reasons"]))
        assert valid == x["n_valid"], x
    big = [x for x in r["sampling"] if x["n"] > r["sampling_sizes"]["other"]]
    assert big and all(x.get("at_tutorial_n") for x in big)     # the headline rows, also per block of 200 (QUICK: 6)
    for x in big:                           # validity and uniqueness per block, re-scored from the stored samples
        size, b = r["sampling_sizes"]["other"], x["at_tutorial_n"]
        assert b["size"] == size and b["blocks"] == x["n"] // size >= 2
        per = [generation_metrics.tutorial_novelty([s if why == "eos" else None for s, why in
                                                    zip(x["samples"][a:a + size], x["stop_reasons"][a:a + size])],
                                                   set())
               for a in range(0, b["blocks"] * size, size)]
        for key in ("validity", "uniqueness"):
            assert abs(b[key]["mean"] - sum(p[key] for p in per) / len(per)) < 1e-12, (key, b)


@slow
def t_smiles_lm_constrained_samples_never_unbalanced():
    r, _ = _smiles_lm()
    for x in r["sampling"]:
        if x["constrained"]:
            assert not set(x["failures_after_eos"]) & {"unbalanced_branch", "unclosed_ring", "unk"}, x
            assert x["failures"]["unk"] == 0 and all("<unk>" not in s for s in x["samples"])


@slow
def t_smiles_lm_saved_model_reloads_and_samples_identically():
    sys.path.insert(0, ROOT)
    import chemdata as cd
    import smiles_grammar
    import transformer as core
    r, folder = _smiles_lm()
    path = os.path.join(folder, "models", "smiles_lm.json")
    model = core.load_model(path)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)["meta"]
    vocab = cd.Vocab(meta["vocab"][len(cd.Vocab.SPECIALS):])
    assert vocab.itos == r["data"]["itos"]
    import demo_smiles_lm                    # each sample draws from its setting's own stream
    x = r["sampling"][8]                     # tau 0.5, all tokens, constrained
    assert x["constrained"] and x["temperature"] == 0.5 and x["top_k"] is None
    with open(os.path.join(folder, "results_smiles_lm.json"), encoding="utf-8") as f:
        config = json.load(f)["config"]
    con = smiles_grammar.SmilesConstraint(vocab, max_new_tokens=r["sampling_sizes"]["constraint_budget"],  # QUICK's
                                          **(config.get("constraint_options") or {}))
    for i in range(2):
        con.begin()                          # a fresh sample, as the demo's draw starts each one
        ids = core.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=0.5,
                          rng=demo_smiles_lm.setting_stream(demo_smiles_lm.SMILES_STREAM, 0, x, i),
                          eos_id=vocab.eos_id, constraint=con,
                          backtrack=config["backtrack"])
        assert "".join(vocab.decode(ids)) == x["samples"][i]


@slow
def t_smiles_lm_extended_quick_has_selfies_and_seeds():
    r = quick_results("smiles_lm", "smiles_lm", "--extended")
    ext = r["extended"]
    assert ext["selfies"]["sampling"] and all(not x["constrained"] for x in ext["selfies"]["sampling"])
    assert ext["selfies"]["fit"]["test"]["bits_per_molecule"] > 0 and ext["seeds"]
    for s in ext["seeds"].values():
        assert len(s["sampling"]) == 16 and s["fit"]["test"]["bits_per_token"] > 0
        if s["distribution"]["available"]:                  # the seed's 4 headline rows, no reference rows
            rows = s["distribution"]["rows"]
            assert len(rows) == 4 and all(x["source"] == "Transformer" for x in rows)
    d = ext["selfies"]["distribution"]
    if d["available"]:
        assert [x["source"] for x in d["rows"]] == ["SELFIES Transformer"] * 2 + ["training (resampled)", "test split"]


def _same_apart_from_timing(a, b, where="results"):
    """a == b, except timing keys, the model's path (its folder) and floats within 1e-9 relative (the
    GuacaMol KL of one sample set differs in the last bits between two processes)."""
    if isinstance(a, dict):
        skip = ("wall", "time", "tokens_per_s", "elapsed", "speedup", "path")
        keys = {k for k in set(a) | set(b) if not any(t in k for t in skip)}
        assert keys <= set(a) and keys <= set(b), (where, keys ^ (set(a) & set(b)))
        for k in keys:
            _same_apart_from_timing(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_apart_from_timing(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (where, a, b)
    else:
        assert a == b, (where, a, b)


@slow
def t_smiles_lm_interrupted_extended_run_resumes_to_the_same_results():
    """Cut off after its stage files were written (here: two of them deleted, as if the call died in the
    seed-0 distribution metrics), a second call of the same --extended run reads the finished stages back
    (sampling, n-gram, SELFIES), recomputes the rest, records which stages it resumed, and writes the
    results an uninterrupted run wrote."""
    quick_results("smiles_lm", "smiles_lm", "--extended")
    first = quick_run_one("smiles_lm", "--extended")[0]
    folder = _temp_folder("quick-smiles_lm-resumed-")
    shutil.copytree(os.path.join(first, "checkpoints"), os.path.join(folder, "checkpoints"))
    stages = os.path.join(folder, "checkpoints", "smiles_lm")
    for tag in ("distribution_seed0", "seed1"):
        os.remove(os.path.join(stages, f"{tag}.stage.json"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", "demo_smiles_lm.py"), "--extended"],
                          env=dict(os.environ, QUICK="1", RESULTS_DIR=folder), cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payloads = []
    for f in (first, folder):
        with open(os.path.join(f, "results_smiles_lm.json"), encoding="utf-8") as fh:
            payloads.append(json.load(fh))
    assert "resumed_stages" not in payloads[0]
    resumed = payloads[1]["resumed_stages"]
    assert resumed[:3] == ["sampling_seed0", "ngram", "selfies"] and resumed[-2:] == ["constraint_probe",
                                                                                     "constraint_candidate"]
    assert len(resumed) == 8 and all(t.startswith("ladder_") for t in resumed[3:6]), resumed   # the ladder: 3 stages
    _same_apart_from_timing(payloads[0]["results"], payloads[1]["results"])
    assert "resumed from" in proc.stdout and os.path.exists(os.path.join(stages, "seed1.stage.json"))


def t_stage_checkpoint_of_another_run_is_refused():
    """A stage file written under another configuration is never read back as this run's: the named
    error says which field differs and how to start afresh."""
    code = (f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'demos')!r}); import common, transformer as core\n"
            "args, config, run = common.start('stagecheck', 'doc', dict(a=1), {})\n"
            "first = run.resumable('probe', lambda: {'x': (1, 2)})\n"
            "again = run.resumable('probe', lambda: 1 / 0)\n"
            "assert first == again == {'x': [1, 2]} and run.resumed_stages == ['probe'], (first, again)\n"
            "run.config['a'] = 2\n"
            "try:\n    run.resumable('probe', lambda: 0)\nexcept core.CheckpointMismatchError as e:\n"
            "    assert 'config' in str(e) and 'delete it' in str(e), e\n    print('refused')\n")
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, QUICK="1", RESULTS_DIR=d),
                              cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def _attention_chem():
    _, folder = _smiles_lm()
    return quick_results("attention_chem", "attention_chem", "--model",
                         os.path.join(folder, "models", "smiles_lm.json"))


@slow
def t_attention_chem_quick_schema():
    """Both splits carry 8 heads with masses in [0, 1] at both partner positions (and their fixed-offset
    controls); the named heads were chosen on validation and are scored on test against the random head."""
    r = _attention_chem()
    for part in ("valid", "test"):
        s = r["splits"][part]
        assert len(s["heads"]) == 8 and len(s["ablation"]["per_head"]) == 8 and s["n_molecules"] > 0
        for h in s["heads"]:
            assert 0 < h["entropy"] and all(v is None or 0 <= v <= 1 for k, v in h.items()
                                            if k not in ("layer", "head", "entropy"))
            assert {"ring_holding", "ring_predicting", "branch_holding_offset", "branch_predicting_offset"} <= set(h)
        for rel, b in s["baselines"].items():
            if b["n_queries"]:
                assert b["whole_molecule_uniform"] <= b["causal_uniform"] <= 1, rel
    test = r["splits"]["test"]
    assert test["baselines"]["ring_holding"]["n_queries"] == test["baselines"]["ring_predicting"]["n_queries"]
    assert test["ablation"]["none"]["n_ring_tokens"] == test["baselines"]["ring_predicting"]["n_queries"]
    assert all(p["ci"]["all"][0] <= p["delta"] <= p["ci"]["all"][1] for p in test["ablation"]["per_head"])
    assert set(r["chosen"]) == {"ring_head", "branch_head", "ring_ablation_head", "prev_token_head", "random_head"}
    rand = r["chosen"]["random_head"]
    for name, c in r["chosen"].items():
        if (c["layer"], c["head"]) != (rand["layer"], rand["head"]):
            assert c["vs_random"]["all"]["n_items"] == test["n_molecules"], name   # paired over test molecules
    assert r["ngram"]["source"].endswith("results_smiles_lm.json") and r["reading"] and r["headline"]


def t_attention_chem_ring_partner_query_positions_are_pinned():
    """On C1CC1 (input <bos> C 1 C C 1, position p holds token p-1) the closing '1' is held by query 5 and
    predicted by query 4 (whose target is that '1'); the key is the opening '1' at position 2.  Same for
    the ')' of CC(C)O."""
    import chemdata
    import demo_attention_chem as d
    toks = chemdata.tokenize_smiles("C1CC1")
    assert d.partner_queries(toks) == [("ring_holding", 5, 2), ("ring_predicting", 4, 2)]
    seq = ["<bos>"] + toks
    assert seq[5] == "1" and seq[2] == "1" and (["<bos>"] + toks + ["<eos>"])[4 + 1] == "1"
    assert d.closing_targets(toks, "ring") == {4} and d.closing_targets(toks, "branch") == set()
    toks = chemdata.tokenize_smiles("CC(C)O")
    assert d.partner_queries(toks) == [("branch_holding", 5, 3), ("branch_predicting", 4, 3)]
    assert d.closing_targets(toks, "branch") == {4}


@slow
def t_esol_and_hopv_run_from_chemdata_dir_with_an_empty_data_folder():
    import importlib.util
    deepchem_installed = importlib.util.find_spec("deepchem") is not None     # without importing it (slow)
    for script, name in (("deepchem_esol", "esol"), ("deepchem_hopv", "hopv")):
        folder, rc, log = quick_run_one(script)
        assert rc == 0, log
        data = os.path.join(folder, "checkout", "data")
        assert sorted(set(os.listdir(data)) - {"deepchem_save"}) == [], os.listdir(data)   # nothing fetched
        with open(os.path.join(folder, f"results_{name}.json"), encoding="utf-8") as f:
            check = json.load(f)["results"]["deepchem_check"]
        assert check.get("available") or check.get("reason"), check              # skipped with its reason
        unusable = str(check.get("reason", "")).startswith("deepchem not importable")
        assert check.get("available") or unusable or not deepchem_installed, check   # it read CHEMDATA_DIR


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))


# ----------------------------------------------------------------------------- experiment 10: data hunger (MOSES)


def _data_hunger():
    return quick_results("data_hunger", "data_hunger")


@slow
def t_data_hunger_quick_schema():
    """QUICK: every planned (size, width, seed) trained at the chosen rate, each verdict by the project's rule,
    the n-gram's choice with its interior check and peak memory, samples scored per model and size, the core
    and the bridge on one trajectory; one seed never 'better' in the file, the per-molecule test bits kept, FCD
    with its n and on a matched n per size."""
    r = _data_hunger()
    plan = r["plan"]
    want = {(int(n), w, s) for w, by in plan["widths"].items() for n, seeds in by.items() for s in seeds}
    got = {(x["size"], x["width"], s) for x in r["rows"] for s in x["seeds"]}
    assert got == want, (got, want)
    for x in r["rows"]:
        assert x["rate"] == r["rates"][x["width"]][str(x["size"])]
        pb, gap, spread = x["paired_bootstrap"], x["gap_bits_per_token"], x["seed_spread"]
        better = pb["ci_high"] < 0 and -gap > spread
        worse = pb["ci_low"] > 0 and gap > spread
        want = "better" if better else "worse" if worse else "level"
        if len(x["seeds"]) == 1 and want != "level":        # one seed: never 'better' or 'worse' in the file
            want = {"better": "lower_one_seed", "worse": "higher_one_seed"}[want]
        assert x["verdict"] == want, (x["verdict"], want)
        ng = r["ngram"][str(x["size"])]
        assert abs(x["test_bits_per_token"]["mean"] - gap - ng["test_bits_per_token"]) < 1e-12
    for n, g in r["ngram"].items():
        assert len(g["test_molecule_bits"]) == r["data"]["n_test"] and g["peak_memory_mb"] > 0
        assert set(g["interior"]) == {"n_interior", "discount_interior"}
        assert r["data"]["vocab"][n]["size"] >= 5
    assert sum(x.get("preferred_by_validation", False) for x in r["rows"] if x["size"] == 200) == 1
    models = {(s["model"], s["size"]) for s in r["sampling"]}
    assert models == {("ngram", int(n)) for n in plan["sizes"]} | {(w, int(n)) for w, by in plan["widths"].items()
                                                                     for n in by}
    for s in r["sampling"]:
        assert s["n_samples"] == plan["n_samples"] and 0 <= s["validity"] <= 1
        assert s["fcd"]["n"] == s["n_valid"] and "valid_smiles" not in s
        same = {t["fcd_matched"]["n"] for t in r["sampling"] if t["size"] == s["size"]}
        assert same == {min(t["n_valid"] for t in r["sampling"] if t["size"] == s["size"])}, same
    assert r["core_check"]["agree"] and r["core_check"]["abs_diff"] <= 1e-6
    assert set(r["crossover"]) >= {"first_better_size", "first_better_width", "interpolated", "range", "gaps",
                                   "never_crossed", "preferred", "by_width"}
    assert all(len(x["test_molecule_bits"]) == r["data"]["n_test"] for x in r["transformer_runs"])   # kept
    text = unwrapped(quick_section("data_hunger", "data_hunger"))   # the page and figures of this run render
    assert "Test bits/token (primary metric)" in text and "## Reading" in text, text[:2000]


def _timeless(x):
    """A results tree without its timings (wall times, speeds: they differ between two calls)."""
    if isinstance(x, dict):
        return {k: _timeless(v) for k, v in x.items()
                if not (k.endswith("_s") or "wall_time" in k or k in ("speeds", "elapsed"))}
    if isinstance(x, list):
        return [_timeless(v) for v in x]
    return x


@slow
def t_data_hunger_quick_resume_gives_the_uninterrupted_results():
    """A run stopped after its first stages (the later stage checkpoints removed, as if Ctrl-C came there) and
    run again gives the uninterrupted run's results, timings aside; the earlier stages are read back."""
    folder, rc, log = quick_run_one("data_hunger")
    assert rc == 0, log
    copy = _temp_folder("quick-data-hunger-resume-")
    shutil.copytree(os.path.join(folder, "checkpoints"), os.path.join(copy, "checkpoints"))
    stages = glob.glob(os.path.join(copy, "checkpoints", "data_hunger", "*.stage.json"))
    dropped = [p for p in stages if "seed1" in p or os.path.basename(p).startswith(("sample_", "core_"))]
    assert dropped and len(dropped) < len(stages)
    for p in dropped:
        os.remove(p)
    env = dict(os.environ, QUICK="1", RESULTS_DIR=copy)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", "demo_data_hunger.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payloads = []
    for f in (folder, copy):
        with open(os.path.join(f, "results_data_hunger.json"), encoding="utf-8") as fh:
            payloads.append(json.load(fh))
    assert "ngram_N200: resumed from" in proc.stdout and "tf_tutorial_N200_seed0_rate0.1: resumed from" in proc.stdout
    assert "resumed_stages" not in payloads[0]          # read back in worker processes, still listed (common.Run)
    assert {"ngram_N200", "tf_tutorial_N200_seed0_rate0.1"} <= set(payloads[1]["resumed_stages"])
    assert _timeless(payloads[0]["results"]) == _timeless(payloads[1]["results"])
    import report_data_hunger       # the overview's lower bound for a resumed run: below an uninterrupted run's wall
    assert 0 < report_data_hunger.recorded_wall_s(payloads[0]["results"]) <= payloads[0]["wall_time_s"]


def t_data_hunger_stage_estimates_match_the_committed_extended_run(monkeypatch):
    """Issue 52 asks for an ETA per stage: experiment 10 estimates each stage from rates measured on this host
    (``stage_estimates``).  Against the committed --extended run (its own plan, as results['plan'] records it),
    at that run's host speed, the estimate of the timed stages (the n-gram, the Transformer, the core check, the
    sampling itself) lies within 25 % of the same stages rebuilt from the run's recorded job times
    (``job_times``), two jobs at a time as the run does (``two_at_a_time``: longest first, each job to the next
    free worker)."""
    import demo_data_hunger as dh
    assert dh.two_at_a_time([5.0, 4.0, 3.0, 2.0]) == 7.0 and dh.two_at_a_time([]) == 0.0
    with open(os.path.join(ROOT, "figures", "results_data_hunger.json"), encoding="utf-8") as f:
        p = json.load(f)
    r = p["results"]
    plan = dh.plan_from_results(r)
    assert p["mode"] == "extended" and plan["sizes"] == dh.PLAN_EXTENDED["sizes"]
    assert set(plan["widths"]) == set(dh.PLAN_EXTENDED["widths"]) and plan["rates"] == dh.PLAN_EXTENDED["rates"]
    ngram, searched, rest, core_s, sampled = dh.job_times(r)
    measured = [dh.two_at_a_time(ngram), dh.two_at_a_time(searched) + dh.two_at_a_time(rest), sum(core_s),
                dh.two_at_a_time(sampled)]
    monkeypatch.setattr(dh, "REFERENCE_S", 0.0)        # reference sets and scoring: not in the job times
    est = dh.stage_estimates(p["config"], plan, p["matmul_mflops"]["start"])[1:5]
    assert abs(sum(est) / sum(measured) - 1) < 0.25, (est, measured)
