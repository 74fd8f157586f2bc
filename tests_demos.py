"""Smoke tests of the experiments: every demo script runs with QUICK=1 into a temporary folder, and
the invariants that must hold whatever the seed are asserted on what it wrote; make_figures.py then
draws every figure from those files.  Every row of demos/experiments.py has a ``t_<results name>_quick*``
test here (t_every_experiment_has_a_script_a_make_figures_section_and_a_quick_test checks it).  Also:
the README's notebook example runs as written, and the README's generated tables agree with the
committed figures/results_*.json.

    python -m pytest tests_demos.py      (or: python tests_demos.py)

The QUICK runs take about two minutes on a 2-core machine; they run once per session and are shared.
"""
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)


@functools.lru_cache(maxsize=None)
def quick_run_one(script, *args):
    """Run demos/demo_<script>.py with QUICK=1 (and extra command-line ``args``) into its own temporary
    folder, once per session; returns (folder, returncode, log tail).  The chemistry demos use this."""
    folder = tempfile.mkdtemp(prefix=f"quick-{script}-")
    env = dict(os.environ, QUICK="1", RESULTS_DIR=folder)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", f"demo_{script}.py"), *args], env=env,
                          cwd=ROOT, capture_output=True, text=True)
    return folder, proc.returncode, proc.stdout[-4000:] + proc.stderr[-4000:]


def quick_results(script, result_name, *args):
    """The ``results`` dict of a QUICK run of one demo, after the checks every payload must pass."""
    folder, rc, log = quick_run_one(script, *args)
    assert rc == 0, f"demo_{script}.py failed:\n{log}"
    with open(os.path.join(folder, f"results_{result_name}.json")) as f:
        payload = json.load(f)
    assert payload["quick"] is True and payload["seed"] == 0 and payload["wall_time_s"] > 0 and payload["git_commit"]
    assert payload["python"] and payload["config"] and payload["mode"] == "quick"
    checks = payload["results"].get("checks", {})
    failed = [k for k, v in checks.items() if v is not True]
    assert not failed, f"{script}: self-checks failed: {failed}"
    return payload["results"]


def make_figures_sections():
    """make_figures.SECTIONS: {results name: (figures, readme, headline)} as its register() calls left it."""
    import make_figures
    return make_figures.SECTIONS


def render_section(name, payload):
    """Draw every registered figure of one experiment into a temporary folder (each must be a real file)
    and return its README section as text."""
    import make_figures
    with tempfile.TemporaryDirectory() as d:
        for fn in make_figures.SECTIONS[name].figures:
            for path in fn(payload, payload["results"], d):
                assert os.path.getsize(path) > 1000, path
    return "\n".join(make_figures.SECTIONS[name].readme(payload))


def quick_section(script, result_name, *args):
    """render_section of the QUICK run of one demo (the one quick_results checked)."""
    with open(os.path.join(quick_run_one(script, *args)[0], f"results_{result_name}.json"), encoding="utf-8") as f:
        return render_section(result_name, json.load(f))


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


def t_make_figures_draws_png_and_svg_of_the_building_blocks():
    """make_figures.py (the command) on one folder holding the QUICK results of experiments 1-3 and the two
    supplementary studies (the registry's building blocks): every figure as PNG and SVG, no warning."""
    blocks = [e for e in experiments.EXPERIMENTS if e.part == experiments.BLOCKS]
    with tempfile.TemporaryDirectory() as folder:
        for e in blocks:
            quick_results(e.script, e.results)
            shutil.copy(os.path.join(quick_run_one(e.script)[0], f"results_{e.results}.json"), folder)
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "make_figures.py"), "--dir", folder],
                              cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stdout + proc.stderr
        pngs = glob.glob(os.path.join(folder, "*.png"))
        assert len(pngs) == sum(len(make_figures_sections()[e.results].figures) for e in blocks), pngs
        for png in pngs:
            svg = png[:-4] + ".svg"
            assert os.path.getsize(png) > 1000 and os.path.getsize(svg) > 1000, png
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def t_make_figures_survives_a_malformed_file():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "results_attention.json"), "w") as f:
            f.write("{not json")
        with open(os.path.join(d, "results_positional.json"), "w") as f:
            json.dump({"results": {"unexpected": 1}}, f)
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "make_figures.py"), "--dir", d],
                              cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "results_attention.json" in proc.stderr and "results_positional.json" in proc.stderr


def t_readme_example_runs_as_written():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"<!-- example:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert block, "README example block not found"
    proc = subprocess.run([sys.executable, "-c", block.group(1)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, smiles = proc.stdout.strip().splitlines()[:2]
    before, after = (float(x) for x in re.findall(r"[0-9.]+", first))
    assert after < before, first


def t_readme_tables_match_results_files():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "make_figures.py"), "--check-readme"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- run_all (the main job)

_FAKE_DEMO = '''"""A stand-in experiment for the run_all tests: FAKE_FAIL_<name> fails it, FAKE_SLEEP_<name> makes it
touch that file and then sleep (so the test can interrupt it)."""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
    """A throwaway git checkout holding run_all.py, common.py, experiments.py, transformer.py and fake demos
    (plus ``extra`` {relative path: text} files), committed."""
    os.makedirs(os.path.join(folder, "demos"))
    for rel, text in (extra or {}).items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "w", encoding="utf-8") as g:
            g.write(text)
    for rel in ("demos/run_all.py", "demos/common.py", "demos/experiments.py", "transformer.py"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f, \
                open(os.path.join(folder, rel), "w", encoding="utf-8") as g:
            g.write(f.read())
    for name in names:
        with open(os.path.join(folder, "demos", f"demo_{name}.py"), "w", encoding="utf-8") as g:
            g.write(_FAKE_DEMO)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "fake"]):
        subprocess.run(git + cmd, cwd=folder, check=True, capture_output=True)


def _run_all(folder, *args, env_extra=None, wait=True):
    env = dict(os.environ, RESULTS_DIR=os.path.join(folder, "out"), **(env_extra or {}))
    env.pop("QUICK", None)
    cmd = [sys.executable, os.path.join(folder, "demos", "run_all.py"), "--quick", "--no-figures", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    proc = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _summary(folder):
    with open(os.path.join(folder, "out", "run_all_summary.json"), encoding="utf-8") as f:
        s = json.load(f)
    return s, {r["name"]: r for r in s["experiments"]}


def t_run_all_reports_missing_and_failed_and_resumes_current():
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d)
        rc, log = _run_all(d, env_extra={"FAKE_FAIL_attention_basics": "1"})
        s, rows = _summary(d)
        assert rc == 1, log
        assert rows["attention_basics"]["status"] == "failed (exit 3)", log
        assert rows["positional"]["status"] == rows["dropout"]["status"] == "ok", log
        assert rows["smiles_lm"]["status"] == "missing" and "MISSING" in log
        assert sum(r["status"] == "missing" for r in rows.values()) == 8
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=d, capture_output=True, text=True).stdout.strip()
        assert rows["dropout"]["git_commit"] == head and rows["dropout"]["mode"] == "quick"
        assert rows["dropout"]["results"] == ["results_dropout.json"] and rows["dropout"]["interpreter"]
        assert s["total_wall_time_s"] >= rows["dropout"]["wall_time_s"] > 0 and "ETA" in log
        rc, log = _run_all(d, "--resume")
        s, rows = _summary(d)
        assert rc == 0, log
        assert rows["positional"]["status"] == rows["dropout"]["status"] == "current", log
        assert rows["attention_basics"]["status"] == "ok" and rows["attention_basics"]["ran"], log


def t_run_all_interrupted_then_resumed():
    import signal
    import time
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d)
        marker = os.path.join(d, "sleeping")
        proc = _run_all(d, "--only", "positional,dropout", env_extra={"FAKE_SLEEP_dropout": marker}, wait=False)
        t0 = time.time()
        while not os.path.exists(marker) and time.time() - t0 < 120 and proc.poll() is None:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        log = proc.communicate(timeout=120)[0]
        assert proc.returncode == 130, log
        assert "--resume" in log and "To resume" in log, log
        _, rows = _summary(d)
        assert rows["positional"]["status"] == "ok" and rows["dropout"]["status"] == "interrupted", rows
        rc, log = _run_all(d, "--only", "positional,dropout", "--resume")
        _, rows2 = _summary(d)
        assert rc == 0, log
        assert rows2["positional"]["status"] == "current" and rows2["dropout"]["status"] == "ok", log
        assert "interrupted attempt" in rows2["dropout"]["note"]
        assert rows2["dropout"]["wall_time_s"] > rows["dropout"]["wall_time_s"]


def t_run_all_extended_reaches_every_experiment():
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("positional", "dropout"))
        env = dict(os.environ, RESULTS_DIR=os.path.join(d, "out"), QUICK="")
        proc = subprocess.run([sys.executable, os.path.join(d, "demos", "run_all.py"), "--extended", "--no-figures",
                               "--only", "positional,dropout"], env=env, cwd=d, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        s, rows = _summary(d)
        assert s["mode"] == "extended" and rows["dropout"]["mode"] == "extended"
        with open(os.path.join(d, "out", "results_positional.json"), encoding="utf-8") as f:
            assert json.load(f)["results"]["extended"] is True


def t_tour_notebook_runs_top_to_bottom():
    """demos/tour.ipynb is committed without outputs and executes cleanly (nbclient, a fresh kernel)."""
    import time
    import nbclient
    import nbformat
    path = os.path.join(ROOT, "demos", "tour.ipynb")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit it without outputs"
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "demos")}}).execute()
    text = "\n".join(o.get("text", "") for c in code for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "PASS" in text and "beam 1:" in text and "valid (RDKit)" in text, text[-3000:]
    print(f"tour.ipynb executed in {time.perf_counter() - t0:.1f} s")


def _reaction():
    """QUICK results of experiment 9 (a tiny model on 20 reactions) and the folder they were written to."""
    return quick_results("reaction_seq2seq", "reaction"), quick_run_one("reaction_seq2seq")[0]


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
    assert [x["width"] for x in ref["topk_vs_width"]] == [1, 3, 5, 10]
    assert len(ref["epochs"]) == 1 and all("valid_token_acc" in e for e in ref["epochs"])
    # the copy baseline's top-1 is a reactant: always valid and always passes the atom check
    assert r["baselines"]["copy_largest"]["test500"]["valid"] == 1.0
    assert r["baselines"]["copy_largest"]["test500"]["conserved"] == 1.0


def t_reaction_canonical_match_counts_a_reordered_product():
    r, _ = _reaction()
    assert r["reorder_check"]["all_hits"] and r["reorder_check"]["n_spelled_differently"] > 0


def t_reaction_beam_width_1_equals_greedy():
    r, _ = _reaction()
    ref = r["runs"]["reference"]
    assert ref["beam1_equals_greedy"] == ref["n_sweep"] > 0


def t_reaction_no_reaction_in_two_splits():
    r, _ = _reaction()
    assert r["splits_overlap"] == 0 and r["checks"]["no_reaction_in_two_splits"]


def t_reaction_saved_model_reloads_and_decodes_identically():
    import transformer as tf
    import chemdata as cd
    r, folder = _reaction()
    assert r["runs"]["reference"]["reload"] == {"n": 2, "same_logits": True, "same_greedy": True}
    path = os.path.join(folder, "models", "reaction_seq2seq.json")
    model = tf.load_model(path)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)["meta"]
    vocab = cd.Vocab(meta["vocab"][len(cd.Vocab.SPECIALS):])
    for p in r["predictions"][:3]:                  # the reloaded model reproduces the run's greedy strings
        src = vocab.encode(cd.tokenize_smiles(p["source"]))
        ids = tf.greedy_decode(model, [vocab.bos_id], meta["max_new_tokens"], src=src, eos_id=vocab.eos_id)
        assert "".join(vocab.decode(ids)) == p["reference"]["greedy"]


def t_reaction_extended_quick_has_the_strong_run():
    r = quick_results("reaction_seq2seq", "reaction", "--extended")
    assert set(r["runs"]) == {"reference", "strong"}
    assert r["runs"]["strong"]["config"]["label_smoothing"] > 0 and r["checks"]["strong_reload_decodes_identically"]
    assert all("strong" in p for p in r["predictions"])


def t_reaction_figures_and_readme_section():
    _reaction()
    text = quick_section("reaction_seq2seq", "reaction")
    assert "*Reading:*" in text and "103,160" in text and text.count("\n| ") >= 10


# ----------------------------------------------------------------------------- experiments 6-8: property prediction

RUN_KEYS = {"split", "model", "seed", "metrics", "test_ids", "y_true", "y_pred"}


def _property(name, *args):
    """(results, folder) of a QUICK run of one property demo (name: its results name)."""
    script = experiments.by_results(name).script
    return quick_results(script, name, *args), quick_run_one(script, *args)[0]


def _check_property_runs(r):
    """Schema, lengths = split sizes, metrics recomputed from the stored predictions, mean baseline R² = 0."""
    import chemdata
    for key in ("data", "splits", "runs", "summary", "curves", "saved_model", "checks"):
        assert key in r, key
    for run in r["runs"]:
        assert RUN_KEYS <= set(run), set(run)
        n = r["splits"][run["split"]]["sizes"][2]
        assert len(run["y_true"]) == len(run["y_pred"]) == len(run["test_ids"]) == n
        t = run["metrics"]["test"]
        assert abs(chemdata.rmse(run["y_true"], run["y_pred"]) - t["rmse"]) < 1e-12
        assert abs(chemdata.mae(run["y_true"], run["y_pred"]) - t["mae"]) < 1e-12
        assert abs(chemdata.r2(run["y_true"], run["y_pred"]) - t["r2"]) < 1e-12
        if run["model"] == "mean":
            assert abs(run["metrics"]["train"]["r2"]) < 1e-12 and t["pearson"] is None
    models = {run["model"] for run in r["runs"]}
    assert {"Transformer", "mean"} <= models


def _check_saved_predictor(folder, name, inputs):
    import chemdata
    pred = chemdata.load_predictor(os.path.join(folder, f"{name}_transformer.json"))
    values = pred.predict(inputs)
    assert all(isinstance(v, float) for v in values[:-1]) and values[-1] is None
    for key in ("tokenizer", "vocab_tokens", "target_mean", "target_std", "units", "task", "train_data_sha256"):
        assert key in pred.meta, key


def t_esol_quick():
    r, folder = _property("esol")
    _check_property_runs(r)
    models = {run["model"] for run in r["runs"]}
    assert {"ridge + fingerprints", "ESOL equation (published)", "ESOL equation (refit)"} <= models
    assert set(r["splits"]) == {"scaffold", "random"}
    dc = r["deepchem_check"]
    if os.environ.get("REQUIRE_CHEM", "").strip().lower() in ("1", "true", "yes"):
        assert dc.get("available"), f"REQUIRE_CHEM=1 but the demo could not use DeepChem: {dc.get('reason')}"
    if dc.get("available"):
        assert "MLP + fingerprints" in models
        assert dc["smiles_equal"] and dc["scaffold_split_equal"] and dc["deepchem_scaffold_sizes"] == [902, 113, 113]
    else:
        assert r["mlp"]["skipped"]
    _check_saved_predictor(folder, "esol", ["CCO", "c1ccccc1O", "C%%"])


def t_hopv_quick():
    r, folder = _property("hopv")
    _check_property_runs(r)
    assert r["data"]["info"]["n_dropped"] == 117 and r["splits"]["random"]["sizes"] == [186, 23, 24]
    assert r["checks"]["no_molecule_in_two_splits"]
    assert r["data"]["token_lengths"]["max"] >= r["data"]["token_lengths"]["mean"] > 10
    _check_saved_predictor(folder, "hopv", ["c1ccsc1", "C1=CC=CS1", "c1cc sc1"])


def t_materials_quick_extended():
    r, folder = _property("materials", "--extended")
    _check_property_runs(r)
    assert set(r["splits"]) == {"random", "group"}
    assert r["checks"]["group_split_no_formula_in_two_splits"] is True
    assert r["splits"]["group"]["test_formulas_in_train"] == 0
    models = {run["model"] for run in r["runs"]}
    assert "Transformer + order augmentation" in models and len(r["seeds"]) >= 2
    priors = [run for run in r["runs"] if run["model"] == "Transformer + periodic-table priors"]
    assert {run["split"] for run in priors} == {"random", "group"}
    plain = next(run for run in r["runs"] if run["model"] == "Transformer")
    assert priors[0]["n_params"] == plain["n_params"] + 8 * 16      # + W_f (8 element features x d)
    for x in r["order_sensitivity"]:
        assert x["mean_abs_change"] >= 0
    att = r["attention"]
    assert len(att["matrix"]) == len(att["elements"]) and abs(sum(att["share_of_element_queries"].values()) - 1) < 1e-6
    _check_saved_predictor(folder, "materials", ["Fe2O3", "Mg2Si", "Xx"])


def _check_property_section(name, *args):
    _property(name, *args)
    text = quick_section(experiments.by_results(name).script, name, *args)
    assert "*Reading:*" in text and "Differences from the tutorial" in text and text.count("\n| ") >= 3


def t_esol_figures_and_readme_section():
    _check_property_section("esol")


def t_hopv_figures_and_readme_section():
    _check_property_section("hopv")


def t_materials_figures_and_readme_section():
    _check_property_section("materials", "--extended")

# ----------------------------------------------------------------------------- experiments 4 and 5


def _smiles_lm():
    """(results, folder) of the QUICK default run of experiment 4."""
    return quick_results("smiles_lm", "smiles_lm"), quick_run_one("smiles_lm")[0]


def t_smiles_lm_quick_schema():
    r, _ = _smiles_lm()
    assert set(r["fit"]) >= {"train", "valid", "test", "test_buckets"} and len(r["fit"]["test_buckets"]) == 4
    for split in ("train", "valid", "test"):
        f = r["fit"][split]
        assert 0 < f["bits_per_token"] < 10 and abs(f["perplexity"] - 2 ** f["bits_per_token"]) < 1e-9
    assert sum(b["n_tokens"] for b in r["fit"]["test_buckets"]) == r["fit"]["test"]["n_tokens"]
    assert len(r["sampling"]) == 16 and sum(x["constrained"] for x in r["sampling"]) == 8
    for x in r["sampling"]:
        assert len(x["samples"]) == x["n"] and 0 <= x["uniqueness"] <= x["validity"] <= 1
        assert sum(x["failures"].values()) == x["n"] - x["n_valid"]
    assert r["speed"]["identical"] and r["speed"]["cached"]["tokens_per_s"] > 0
    assert r["history"]["epochs"] and r["history"]["steps"] and r["reading"]


def t_smiles_lm_validity_rescored_from_stored_samples():
    import chemdata as cd
    r, _ = _smiles_lm()
    assert not cd.is_valid_smiles("C1CC") and cd.smiles_failure_reason("C1CC") == "unclosed_ring"
    for x in r["sampling"]:
        valid = sum(bool(s) and "<unk>" not in s and cd.canonical_smiles(s) is not None for s in x["samples"])
        assert valid == x["n_valid"], x


def t_smiles_lm_constrained_samples_never_unbalanced():
    r, _ = _smiles_lm()
    for x in r["sampling"]:
        if x["constrained"]:
            assert not set(x["failures_after_eos"]) & {"unbalanced_branch", "unclosed_ring", "unk"}, x
            assert x["failures"]["unk"] == 0 and all("<unk>" not in s for s in x["samples"])


def t_smiles_lm_saved_model_reloads_and_samples_identically():
    sys.path.insert(0, ROOT)
    import chemdata as cd
    import transformer as tf
    r, folder = _smiles_lm()
    path = os.path.join(folder, "models", "smiles_lm.json")
    model = tf.load_model(path)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)["meta"]
    vocab = cd.Vocab(meta["vocab"][len(cd.Vocab.SPECIALS):])
    assert vocab.itos == r["data"]["itos"]
    x = r["sampling"][8]                                  # tau 0.5, all tokens, constrained; items k * n + i
    assert x["constrained"] and x["temperature"] == 0.5 and x["top_k"] is None
    with open(os.path.join(folder, "results_smiles_lm.json"), encoding="utf-8") as f:
        config = json.load(f)["config"]
    con = cd.SmilesConstraint(vocab, max_new_tokens=config["max_new_tokens"])   # the QUICK budget
    for i in range(2):
        ids = tf.generate(model, [vocab.bos_id], config["max_new_tokens"], temperature=0.5,
                          rng=tf._item_rng(0, 8 * x["n"] + i), eos_id=vocab.eos_id, constraint=con,
                          backtrack=config["backtrack"])
        assert "".join(vocab.decode(ids)) == x["samples"][i]


def t_smiles_lm_extended_quick_has_selfies_and_seeds():
    r = quick_results("smiles_lm", "smiles_lm", "--extended")
    ext = r["extended"]
    assert ext["selfies"]["sampling"] and all(not x["constrained"] for x in ext["selfies"]["sampling"])
    assert ext["selfies"]["fit"]["test"]["bits_per_molecule"] > 0 and ext["seeds"]
    for s in ext["seeds"].values():
        assert len(s["sampling"]) == 16 and s["fit"]["test"]["bits_per_token"] > 0


def _attention_chem():
    _, folder = _smiles_lm()
    return quick_results("attention_chem", "attention_chem", "--model",
                         os.path.join(folder, "models", "smiles_lm.json"))


def t_attention_chem_quick_schema():
    r = _attention_chem()
    assert len(r["heads"]) == 8 and len(r["ablation"]["per_head"]) == 8
    for h in r["heads"]:
        assert 0 < h["entropy"] and all(v is None or 0 <= v <= 1 for k, v in h.items() if k not in ("layer", "head", "entropy"))
    for rel, b in r["baselines"].items():
        if b["n_queries"]:
            assert b["whole_molecule_uniform"] <= b["causal_uniform"] <= 1, rel
    assert set(r["ablation"]["chosen"]) == {"ring_head", "prev_token_head", "random_head"}
    assert r["reading"] and r["headline"]


def t_smiles_lm_figures_and_readme_section():
    r, _ = _smiles_lm()
    text = quick_section("smiles_lm", "smiles_lm")
    assert "*Reading:* " + r["reading"] in text and text.count("\n| ") >= 8   # the demo's reading, in the README


def t_attention_chem_figures_and_readme_section():
    _, folder = _smiles_lm()
    _attention_chem()
    text = quick_section("attention_chem", "attention_chem", "--model",
                         os.path.join(folder, "models", "smiles_lm.json"))
    assert "*Reading:*" in text and text.count("\n| ") >= 8


def t_readme_overview_lists_every_study_and_judges_the_budget():
    """The README's top table: one row per experiment, 'not run yet' for a missing results file,
    wall times from run_all_summary.json, and a budget reading computed from the summary's total."""
    sys.path.insert(0, ROOT)
    import make_figures
    n = len(experiments.EXPERIMENTS)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(ROOT, "figures", "results_dropout.json"), encoding="utf-8") as f:
            payload = json.load(f)
        with open(os.path.join(d, "results_dropout.json"), "w", encoding="utf-8") as f:
            json.dump(payload, f)
        rows = [{"name": "dropout", "status": "ok", "wall_time_s": 123.0, "mode": payload.get("mode"),
                 "git_commit": payload.get("git_commit")}]          # the main job wrote this results file
        summary = {"mode": "default", "interpreter": "CPython 3.11", "git_commit": "abc", "cpu_count": 2,
                   "total_wall_time_s": 91 * 60.0, "experiments": rows}
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        md = make_figures.readme_overview(d, make_figures._heading("dropout") + "\n")
        table = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
        assert len(table) == n, md
        assert sum("not run yet" in line for line in table) == n - 1, md
        drop = next(line for line in table if "dropout" in line)
        assert "(#supplementary--dropout-statistics-on-a-causal-attention-matrix)" in drop and "2.0 min" in drop, drop
        rows[0]["git_commit"] = "another"                   # a file from another run keeps its own time
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        drop = next(line for line in make_figures.readme_overview(d, "").splitlines() if "dropout" in line)
        assert "2.0 min" not in drop and drop.endswith(f"| {make_figures._fmt_min(payload['wall_time_s'])} |"), drop
        rows[0]["git_commit"] = payload.get("git_commit")
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        assert "over the 90-minute budget" in md, md
        summary["total_wall_time_s"] = 60 * 60.0
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        assert "within the 90-minute budget" in make_figures.readme_overview(d, "")


def t_every_experiment_has_a_script_a_make_figures_section_and_a_quick_test():
    """Every row of demos/experiments.py: run_all runs its script (first, in the registry's order), make_figures
    registered its figures, README section and overview headline, and a t_<results name>_quick* test here
    runs its QUICK configuration; no make_figures section belongs to no row."""
    import run_all
    rows = experiments.EXPERIMENTS
    for field in ("script", "results", "heading"):
        assert len({getattr(e, field) for e in rows}) == len(rows), field
    found = run_all.discover()[:len(rows)]
    assert [n for n, _ in found] == [e.script for e in rows]
    assert not [n for n, script in found if script is None], f"missing demos/demo_<name>.py: {found}"
    sections = make_figures_sections()
    assert set(sections) == {e.results for e in rows}, set(sections) ^ {e.results for e in rows}
    for e in rows:
        s = sections[e.results]
        assert s.figures and callable(s.readme) and callable(s.headline), e
        assert any(name.startswith(f"t_{e.results}_quick") for name in globals()), f"no t_{e.results}_quick* test"


def t_git_commit_ignores_the_outputs_the_main_job_writes():
    """Results written by one experiment must not make the next one's git_commit '-dirty' (figures/, models/
    and README.md are outputs); a changed script does."""
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("dropout",), extra={"figures/results_old.json": "{}", "README.md": "x\n",
                                                   "models/m.json": "{}"})
        probe = [sys.executable, "-c", "import sys; sys.path.insert(0, 'demos'); import common; "
                                       "print(common.git_commit())"]

        def commit():
            return subprocess.run(probe, cwd=d, capture_output=True, text=True, check=True).stdout.strip()
        for rel in ("figures/results_old.json", "README.md", "models/m.json"):
            with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
                f.write("changed\n")
        assert not commit().endswith("-dirty"), commit()
        with open(os.path.join(d, "demos", "demo_dropout.py"), "a", encoding="utf-8") as f:
            f.write("# changed\n")
        assert commit().endswith("-dirty"), commit()


# ---------------------------------------------------------------------------
# the code a learner reads: short functions, public names of the core, a refactor check that can fail

def t_no_function_in_the_library_or_demos_is_over_60_lines():
    """transformer.py, chemdata.py, bpe.py, make_figures.py and demos/: every function <= 60 lines."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import function_lengths
    too_long = [(n, where) for n, where in function_lengths.all_lengths(ROOT) if n > function_lengths.LIMIT]
    assert function_lengths.project_files(ROOT) and not too_long, too_long


def t_demos_use_only_public_names_of_the_core():
    """No ``tf._name`` (transformer.py's private names) outside transformer.py and its tests."""
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "demos", "*.py")) + [os.path.join(ROOT, "make_figures.py"),
                                                                   os.path.join(ROOT, "chemdata.py")]:
        with open(path, encoding="utf-8") as f:
            offenders += [f"{os.path.basename(path)}:{i}" for i, line in enumerate(f, 1)
                          if re.search(r"\b(tf|transformer)\._[a-z]", line)]
    assert not offenders, offenders


def t_compare_results_finds_a_changed_number_and_ignores_only_times():
    """tools/compare_results.py, the check that a refactor changed no number: a wall time, a speed or a
    commit may differ; a float in the last bit, a string or a missing key may not."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import compare_results as cr
    base = {"git_commit": "a", "wall_time_s": 1.0, "results": {"rmse": 0.5, "fit": {"test": [2.5, 3]},
            "speed": {"n_tokens": 43, "tokens_per_s": 500.0}, "elapsed": 3.0, "betas": [0.9, 0.999]}}
    same = json.loads(json.dumps(base))
    same.update(git_commit="b", wall_time_s=9.0)
    same["results"]["speed"]["tokens_per_s"], same["results"]["elapsed"] = 100.0, 7.0
    assert cr.diff(base, same) == []
    for change in (("rmse", 0.5 + 2 ** -53), ("betas", [0.9, 0.99]), ("fit", {"test": [2.5, 4]})):
        other = json.loads(json.dumps(base))
        other["results"][change[0]] = change[1]
        assert [p for p, _, _ in cr.diff(base, other)], change
    other = json.loads(json.dumps(base))
    other["results"]["speed"]["n_tokens"] = 44
    assert [p for p, _, _ in cr.diff(base, other)] == ["$.results.speed.n_tokens"]
    del other["results"]["rmse"]
    assert "$.results.rmse" in [p for p, _, _ in cr.diff(base, other)]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for folder, payload in ((a, base), (b, same)):
            with open(os.path.join(folder, "results_x.json"), "w", encoding="utf-8") as f:
                json.dump(payload, f)
        assert cr.main([a, b]) == 0
        with open(os.path.join(b, "results_y.json"), "w", encoding="utf-8") as f:
            json.dump(base, f)
        assert cr.main([a, b]) == 1                                   # a file only one folder has


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
