"""The pages and the README: each report module draws its figures and renders its page from a QUICK run's
results; the README's generated blocks and the pages agree with the committed figures/results_*.json
(``make_figures.py --check-readme``); the README's example runs as written; no generated line is too long;
and the comparison rules of demos/report_kit.py (paired items, like-for-like numbers, verdicts that name
their test) hold on every page.

    python -m pytest tests/tests_pages.py      (or: python tests/tests_pages.py)
"""
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)

from tests_studies import (  # noqa: E402  (the shared QUICK runs and page helpers, after the path set-up)
    _attention_chem, _committed, _property, _reaction, _smiles_lm, quick_results, quick_run_one, quick_section,
    report, slow, unwrapped)

@slow
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
        assert len(pngs) == sum(len(report(e.results).FIGURES) for e in blocks), pngs
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


def t_readme_and_pages_match_results_files():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "make_figures.py"), "--check-readme"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def t_check_readme_fails_on_a_stale_missing_stray_or_failed_page():
    """make_figures.check on copies of README.md and docs/: 0 as committed; 1 when one page line changed, a
    page is missing, a page belongs to no study, the README's overview table changed, or a page cannot be
    generated (a malformed results file)."""
    import make_figures
    figures = os.path.join(ROOT, "figures")

    def copies(d):
        shutil.copytree(os.path.join(ROOT, "docs"), os.path.join(d, "docs"))
        shutil.copy(os.path.join(ROOT, "README.md"), d)
        return os.path.join(d, "README.md"), os.path.join(d, "docs")
    with tempfile.TemporaryDirectory() as d:
        readme, docs = copies(d)
        assert make_figures.check(figures, readme, docs) == 0
        page = os.path.join(docs, experiments.EXPERIMENTS[-1].page + ".md")
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for damage in (lambda: open(page, "w", encoding="utf-8").write(text.replace("0.", "0,", 1)),
                       lambda: os.remove(page),
                       lambda: open(os.path.join(docs, "99-extra.md"), "w").write("x\n")):
            damage()
            assert make_figures.check(figures, readme, docs) == 1
            shutil.rmtree(docs)
            os.remove(readme)
            readme, docs = copies(d)
        with open(readme, encoding="utf-8") as f:
            r = f.read()
        with open(readme, "w", encoding="utf-8") as f:
            f.write(r.replace("| study | headline here |", "| study | headline |"))
        assert make_figures.check(figures, readme, docs) == 1
    with tempfile.TemporaryDirectory() as d:                       # results that break one page
        folder = os.path.join(d, "figures")
        shutil.copytree(figures, folder, ignore=shutil.ignore_patterns("*.png", "*.svg", "checkpoints", "quick"))
        with open(os.path.join(folder, "results_dropout.json"), "w", encoding="utf-8") as f:
            json.dump({"results": {"unexpected": 1}}, f)
        readme, docs = copies(d)
        assert make_figures.check(folder, readme, docs) == 1


def t_no_generated_line_is_over_300_characters_and_the_readme_is_short():
    """Every line of every page (docs/*.md) and of the README's generated blocks is at most 300 characters;
    the README is at most 350 lines; every page starts with the comment that says how it is generated, and
    its reading has one to six bullets."""
    import report_kit
    for path in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        assert lines[0].startswith("<!-- Generated by `python make_figures.py --readme`"), path
        long = [(i, len(x)) for i, x in enumerate(lines, 1) if len(x) > report_kit.MAX_LINE]
        assert not long, (path, long)
        reading = lines[lines.index("## Reading") + 1:lines.index("## Differences from the tutorial")]
        assert 1 <= sum(x.startswith("- ") for x in reading) <= 6, (path, reading)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 350, len(text.splitlines())
    blocks = re.findall(r"<!-- BEGIN GENERATED: (\w+).*?-->\n(.*?)<!-- END GENERATED", text, re.S)
    assert {name for name, _ in blocks} == {"overview", "speed", "tests"}, [name for name, _ in blocks]
    long = [len(x) for _, body in blocks for x in body.splitlines() if len(x) > report_kit.MAX_LINE]
    assert not long, long
    assert max(len(x) for x in report_kit.wrap("word " * 100 + "- 1. > # | x" * 20)) <= report_kit.WRAP + 12
    wrapped = report_kit.wrap("a " * 53 + "- b " + "1. c " * 40)
    assert len(wrapped) > 2 and not [x for x in wrapped[1:] if report_kit.MARKDOWN_MARKER.match(x)], wrapped


@slow
def t_reaction_figures_and_readme_section():
    _reaction()
    text = quick_section("reaction_seq2seq", "reaction")
    assert "## Reading" in text and "103,160" in text and text.count("\n| ") >= 10


def t_kit_paired_comparisons_refuse_unequal_item_lists():
    """report_kit's pairing rule: two item lists that differ in an item, in order or in length are refused
    (UnpairedComparisonError, naming the difference); scored_pairs keeps the items BOTH sides score; and
    experiment 9's paired_comparison of a mean over valid predictions is over the valid items on both sides."""
    import report_kit as kit
    import demo_reaction_seq2seq as rx
    for a, b, said in (([1, 2, 3], [1, 2, 4], "item 2: 3 against 4"), ([1, 2, 3], [2, 1, 3], "item 0"),
                       ([1, 2, 3], [1, 2], "3 items against 2")):
        try:
            kit.same_items(a, b)
        except kit.UnpairedComparisonError as e:
            assert said in str(e), e
        else:
            raise AssertionError(f"same_items accepted {a} against {b}")
    assert kit.scored_pairs([1, 2, 3], [0.5, None, 0.1], [1, 2, 3], [0.2, 0.3, None]) == ([1], [0.5], [0.2])
    a = {"model": "m", "seed": 0, "test_ids": [10, 11, 12, 13], "tanimoto_valid": [0.2, None, None, 0.4]}
    b = {"model": "copy", "seed": 0, "test_ids": [10, 11, 12, 13], "tanimoto_valid": [0.5, 0.9, 0.9, 0.7]}
    c = rx.paired_comparison(a, b, "tanimoto_valid", "test")
    assert c["items"] == [10, 13] and c["n_items"] == 2 and (c["n_scored_a"], c["n_scored_b"]) == (2, 4)
    assert abs(c["mean_b"] - 0.6) < 1e-12 and abs(c["diff"] - (0.3 - 0.6)) < 1e-12     # not copy's 0.75 over all 4
    try:
        rx.paired_comparison(a, dict(b, test_ids=[10, 11, 13, 12]), "tanimoto_valid", "test")
    except kit.UnpairedComparisonError:
        pass
    else:
        raise AssertionError("paired_comparison accepted two orders of the items")


def t_kit_marks_a_run_resumed_when_its_strict_recorded_work_exceeds_its_wall_time():
    """A results file whose stages were read back by worker processes did not list them (fixed in common.Run;
    experiment 10's committed run predates the fix): where a report module's recorded_wall_s is a strict lower
    bound (RECORDED_WALL_STRICT), more recorded work than the file's wall time marks the run resumed, in the
    overview's wall-time cell and on the provenance line; a non-strict sum never does."""
    import types
    import report_kit as kit
    study = types.SimpleNamespace(script="x")
    payload = {"mode": "extended", "python": "3.11.7", "dot_impl": "sum(map(mul))", "seed": 0, "git_commit": "c",
               "wall_time_s": 600.0, "matmul_mflops": {"start": 90.0, "end": 90.0}, "results": {}}
    strict = types.SimpleNamespace(RECORDED_WALL_STRICT=True, recorded_wall_s=lambda r: 3000.0)
    loose = types.SimpleNamespace(recorded_wall_s=lambda r: 3000.0)
    assert kit._wall_cell(study, payload, [], strict) == "≥ 50.0 min (extended, resumed)"
    assert kit._wall_cell(study, payload, [], loose) == "10.0 min (extended, host 90 Mflop/s)"
    assert "at least 50.0 min" in kit.provenance("x", payload, strict)
    assert "resumed" not in kit.provenance("x", payload, loose)
    quick = types.SimpleNamespace(RECORDED_WALL_STRICT=True, recorded_wall_s=lambda r: 500.0)
    assert "resumed" not in kit._wall_cell(study, payload, [], quick) + kit.provenance("x", payload, quick)


def t_kit_beside_refuses_unlike_numbers_and_verdicts_name_their_test():
    """report_kit.beside sets two numbers side by side only when they are the same statistic over the same
    items; judged refuses a verdict without its test."""
    import report_kit as kit
    stat = kit.Stat("1.0", "within-row variance", "16 keys × 400 draws")
    assert kit.beside(stat, stat._replace(text="2.0")) == ("1.0", "2.0")
    for field, value in (("statistic", "pooled variance"), ("items", "16 keys × 200 draws")):
        try:
            kit.beside(stat, stat._replace(**{field: value}))
        except kit.UnlikeComparisonError as e:
            assert value in str(e), e
        else:
            raise AssertionError(f"beside accepted another {field}")
    assert kit.judged("level with", "paired bootstrap") == "level with (paired bootstrap)"
    try:
        kit.judged("best", " ")
    except ValueError:
        pass
    else:
        raise AssertionError("judged accepted a verdict without a test")


def t_overview_rows_of_experiments_1_3_9_are_like_for_like():
    """The overview rows of experiments 1, 3 and 9 set the tutorial's numbers beside the same statistic of
    ours: experiment 1 the WITHIN-ROW variance at d_k = 512 (the pooled one does not move it), experiment 3 the
    ALL-TARGETS accuracy at length 30, the mean over its seeds (the counted-targets one does not move it),
    experiment 9 greedy exact match and validity on 150 test reactions."""
    import copy as copying
    import report_attention_basics as ra
    import report_length_generalization as rl
    import report_reaction_seq2seq as rr
    att = _committed("attention")
    row = next(x for x in att["scaling"] if x["d_k"] == 512)
    ours, ref = ra.headline(att)
    assert f"{row['unscaled_within_row_var']:.1f} unscaled, {row['scaled_within_row_var']:.3f} scaled" in ours
    assert ref == "489, 0.955"
    moved = copying.deepcopy(att)
    next(x for x in moved["scaling"] if x["d_k"] == 512).update(unscaled_var=1e9, scaled_var=7.0)
    assert ra.headline(moved) == (ours, ref)
    lg = _committed("length_generalization")
    tr = lg["tasks"]["periodic"]
    means = {p: next(x["mean"] for x in tr["accuracy_all_targets_stats"][p] if x["length"] == 30)
             for p in ("rope", "sine")}
    ours, ref = rl.headline(lg)
    assert f"mean of {len(lg['seeds'])} seeds: RoPE {means['rope']:.3f}, sine {means['sine']:.3f}" in ours, ours
    assert ref == "0.815, 0.564"
    moved = copying.deepcopy(lg)
    moved["tasks"]["periodic"]["accuracy_stats"] = {}
    assert rl.headline(moved) == (ours, ref)
    g = _committed("reaction")["runs"]["reference"]["metrics"]["greedy"]["test150"]
    import evaluation
    lo, hi = evaluation.wilson_interval(round(g["valid"] * 150), 150)
    word = "inside" if lo <= 0.087 <= hi else "outside"
    rlo, rhi = evaluation.wilson_interval(round(0.087 * 150), 150)     # the tutorial's own, over its 150
    word += "; intervals overlap" if word == "outside" and rlo <= hi and lo <= rhi else ""
    assert rr.headline(_committed("reaction")) == (f"greedy exact match {g['top1']:.3f}, valid {g['valid']:.3f} "
                                                   f"[{lo:.3f}, {hi:.3f}] over 150 test reactions (tutorial's {word})",
                                                   "0.000, 0.087")


VERDICT_WORDS = re.compile(r"\b(level with|better|worse|beats|loses to|best)\b")


TEST_WORDS = ("interval", "seed", "paired", "bootstrap", "standard error", "test")


def t_every_verdict_in_the_readings_of_pages_1_3_9_10_names_its_test():
    """In the readings of docs/01, 03, 09 and 10, every sentence that says level, better, worse, beats, loses to
    or best also names the test that decided it (an interval, a paired test, a seed spread)."""
    for page in ("01-attention", "03-length-generalization", "09-reaction", "10-graduate-torch"):
        with open(os.path.join(ROOT, "docs", page + ".md"), encoding="utf-8") as f:
            text = f.read()
        reading = unwrapped(text[text.index("## Reading"):text.index("## Differences from the tutorial")])
        for bullet in reading.split(" - "):
            for sentence in re.split(r"(?<=[.;])\s", bullet):
                if VERDICT_WORDS.search(sentence) and "no paired test" not in sentence:
                    assert any(w in sentence for w in TEST_WORDS), (page, sentence)


def t_graduate_compute_reading_extrapolates_a_known_curve():
    """The scale reading's 'how much compute': on a curve that gains exactly 0.05 top-1 and 0.1 Tanimoto per
    doubling of training time (0.05 and 0.2 at 10 minutes), top-1 0.30 lies 5 doublings past 10 minutes
    (320 minutes) and the copy baseline's 0.5 three past (80 minutes); a flat curve says so; a reached
    target is said reached."""
    import report_graduate_torch as g

    def curve(top1, tan):
        pts = [{"train_minutes": m, "metrics": {"beam5": {"top1": top1(m), "tanimoto": tan(m)}}} for m in (10, 20, 40)]
        return {"points": pts, "baselines": {"copy_largest": {"tanimoto": 0.5}}}

    def sentences(sc):
        return " ".join(g.compute_sentences(sc))
    a, b = g.loglin([10, 20, 40], [0.05, 0.10, 0.15])
    assert abs(b - 0.05) < 1e-12 and abs(a + 0.05 * math.log2(10) - 0.05) < 1e-12
    rising = sentences(curve(lambda m: 0.05 + 0.05 * math.log2(m / 10), lambda m: 0.2 + 0.1 * math.log2(m / 10)))
    assert "still moves with training time" in rising and "about 5 hours" in rising and "about 80 minutes" in rising
    assert "data, width and steps together" in rising, rising
    flat = sentences(curve(lambda m: 0.0, lambda m: 0.1))
    assert "does not move with training time" in flat and flat.count("not being approached") == 2, flat
    done = sentences(curve(lambda m: 0.4, lambda m: 0.6))
    assert done.count("is reached at 40 training minutes") == 2, done
    level = curve(lambda m: 0.4, lambda m: 0.6)                # above copy's mean, but the paired test says level
    level["comparisons"] = [{"a": "torch scale, beam5", "b": "copy_largest", "metric": "tanimoto", "verdict": "level",
                             "diff": 0.1, "ci_low": -0.01, "ci_high": 0.2, "n_items": 3}]
    text = sentences(level)
    assert "Tanimoto (0.500) is matched but not passed" in text and "top-1 0.30 is reached" in text, text
    assert "was not reached" in " ".join(g.scale_sentences(dict(level, n_train=10, params=5, config={
        "batch_size": 2}, threads=2, device="cpu", points=[dict(level["points"][-1], steps=4, epochs=0.8)])))


def _check_property_section(name, *args):
    _property(name, *args)
    text = quick_section(experiments.by_results(name).script, name, *args)
    assert "## Reading" in text and "## Differences from the tutorial" in text and text.count("\n| ") >= 3


@slow
def t_esol_figures_and_readme_section():
    _check_property_section("esol")


@slow
def t_hopv_figures_and_readme_section():
    _check_property_section("hopv")


@slow
def t_hopv_reading_says_when_the_epoch_cap_ended_early_stopping():
    """A seed whose best validation epoch is the last one allowed was ended by the cap, not the patience:
    the reading says so (and how many), and says nothing when no seed reached the cap.  On the committed
    results when they are an --extended run, else on a QUICK --extended run (never skipped)."""
    import copy
    import report_deepchem_hopv
    with open(os.path.join(ROOT, "figures", "results_hopv.json")) as f:
        r = json.load(f)["results"]
    if "early_stopping" not in r:                  # a default-mode results file has no early-stopping row
        r = _property("hopv", "--extended")[0]
    cap, n = r["transformer"]["early_stopping"]["max_epochs"], len(r["early_stopping"])
    assert n >= 2 and cap >= 2, (n, cap)
    for best, words in (([1] * (n - 1) + [cap], f"1 of {n} chose the last allowed epoch"),
                        ([cap] * n, f"{n} of {n} chose the last allowed epoch"), ([cap - 1] * n, None)):
        r2 = copy.deepcopy(r)
        for e, b in zip(r2["early_stopping"], best):
            e["best_epoch"] = b
        text = " ".join(report_deepchem_hopv.reading(r2))
        assert (words in text) if words else ("last allowed epoch" not in text), (best, text)


@slow
def t_materials_figures_and_readme_section():
    _check_property_section("materials", "--extended")


@slow
def t_attention_chem_reading_follows_the_ngram_numbers():
    """The experiment-5 reading says the n-gram comparison is missing when it is, and flips with the
    numbers when it is there (experiment 4's rule: beyond the seed spread and a paired interval below 0)."""
    import copy
    import report_attention_chem
    r = copy.deepcopy(_attention_chem())
    r["ngram"] = {"ngram_bits_per_token": None, "why_not": "no n-gram entry"}
    assert "n-gram baseline is absent (no n-gram entry)" in report_attention_chem.reading_text(r)
    r["ngram"] = {"ngram_bits_per_token": 3.0, "transformer_bits_per_token": 2.5, "transformer_seed_sd": 0.01,
                  "paired_bootstrap": {"diff": -9.0, "ci_low": -11.0, "ci_high": -7.0}}
    assert "it beats the n-gram" in report_attention_chem.reading_text(r)
    r["ngram"]["ngram_bits_per_token"] = 2.505                         # a gap within the seed spread
    assert "does not beat the n-gram" in report_attention_chem.reading_text(r)
    r["ngram"].update(ngram_bits_per_token=3.0, paired_bootstrap={"diff": -1.0, "ci_low": -3.0, "ci_high": 1.0})
    assert "does not beat the n-gram" in report_attention_chem.reading_text(r)


@slow
def t_smiles_lm_figures_and_readme_section():
    r, _ = _smiles_lm()
    text = quick_section("smiles_lm", "smiles_lm")
    import report_smiles_lm
    bullets = report_smiles_lm.reading(r)
    assert " ".join(bullets) == r["reading"] and text.count("\n| ") >= 8     # the demo's reading, on the page
    assert all(unwrapped(b[1:]) in unwrapped(text) for b in bullets), text


def t_smiles_lm_reading_counts_eos_failures_of_the_tau_1_setting():
    """The bullet on what the constraint cannot see gives the invalid-at-<eos> and kekulization counts of
    τ = 1.0, all tokens, seed 0 (the headline's setting), not their sum over the constrained settings; that
    sum is labelled as such."""
    import report_smiles_lm

    def row(tau, top_k, constrained, n, failures, stuck=0):
        return {"temperature": tau, "top_k": top_k, "constrained": constrained, "n": n, "validity": 0.9,
                "n_valid": 9 * n // 10, "n_unique_valid": 8 * n // 10, "uniqueness": 0.8, "novelty": 0.7,
                "novelty_of_valid": 0.7, "failures_after_eos": failures,
                "stop_reasons": {"eos": n - stuck, "no_allowed_token": stuck}}
    r = {"fit": {"test": {"bits_per_token": 2.5}},
         "sampling": [row(1.0, None, False, 10000, {"kekulization": 900, "valence": 300}),
                      row(1.0, None, True, 10000, {"kekulization": 27, "other": 14}, stuck=72),
                      row(1.3, None, True, 200, {"kekulization": 21, "valence": 8})]}
    bullet = next(b for b in report_smiles_lm.reading(r) if "cannot see" in b)
    assert "at τ = 1.0 (all tokens, seed 0), 41 of the 10000 constrained samples (0.4% [0.3, 0.6]) ended with <eos>" \
        in bullet, bullet
    assert "27 of them by kekulization" in bullet, bullet
    assert "; 70 invalid after <eos> over all 2 constrained settings)" in bullet, bullet
    assert "48" not in bullet and "72 of 10000" in bullet, bullet
    assert len(report_smiles_lm.reading(r)) <= 6


@slow
def t_attention_chem_figures_and_readme_section():
    _, folder = _smiles_lm()
    _attention_chem()
    text = quick_section("attention_chem", "attention_chem", "--model",
                         os.path.join(folder, "models", "smiles_lm.json"))
    assert "## Reading" in text and text.count("\n| ") >= 8


def t_readme_overview_lists_every_study_and_judges_the_budget():
    """The README's top table: one row per experiment linked to its page, 'not run yet' for a missing results
    file, wall times from run_all_summary.json, and a budget reading computed from the summary's total."""
    sys.path.insert(0, ROOT)
    import make_figures
    import report_kit
    n = len(experiments.EXPERIMENTS)

    def overview(d):
        return report_kit.overview_block(d, make_figures.load_results(d), make_figures.reports())
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
        md = overview(d)
        table = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
        assert len(table) == n, md
        assert sum("not run yet" in line for line in table) == n - 1, md
        assert all(f"(docs/{e.page}.md)" in line for e, line in zip(experiments.EXPERIMENTS, table)), table
        drop = next(line for line in table if "dropout" in line)
        assert "2.0 min" in drop, drop
        rows[0]["git_commit"] = "another"                   # a file from another run keeps its own time
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        drop = next(line for line in overview(d).splitlines() if "dropout" in line)
        own = report_kit.minutes(payload["wall_time_s"])  # the file's own time, and its host's speed if recorded
        own += f" (host {payload['matmul_mflops']['start']:.0f} Mflop/s)" if payload.get("matmul_mflops") else ""
        assert "2.0 min" not in drop and drop.endswith(f"| {own} |"), drop
        rows[0]["git_commit"] = payload.get("git_commit")
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        assert "over the 90-minute budget and over the 60-minute target" in md, md
        summary["total_wall_time_s"] = 60 * 60.0
        with open(os.path.join(d, "run_all_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f)
        assert "within the 90-minute budget and within the 60-minute target" in overview(d)


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
