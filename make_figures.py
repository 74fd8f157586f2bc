"""Render every figures/results_*.json into figures (PNG + SVG) and, with --readme, regenerate the study
pages (docs/<nn>-<study>.md) and the README's generated blocks (the overview of all studies, Speed, tests) from
the same files.

    python make_figures.py                      # figures/results_*.json -> figures/*.png, *.svg
    python make_figures.py --dir figures/quick  # the QUICK results of a smoke run
    python make_figures.py --readme             # also rewrite docs/*.md and the README's generated blocks
    python make_figures.py --check-readme       # exit 1 if a page or a README block is stale or failed

The results JSON files are the single source of truth: every number in a figure, a page or the README is
read from them.  This file is only the command line: it walks the registry (demos/experiments.py) and
calls each study's report module, demos/report_<script>.py (its figures, page parts, reading and overview
row; the interface is described in demos/report_kit.py).  The Speed block comes from
demos/report_bench_core.py, the tests block (make test's counts) from demos/suite_counts.py.  A missing or
malformed results file skips its figures with a one-line warning; it never stops the other figures.
matplotlib (Agg backend) is the only third-party import.
"""
import argparse
import glob
import importlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
FIG_DIR = os.path.join(ROOT, "figures")
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
sys.path.insert(0, os.path.join(ROOT, "demos"))

import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)
import report_bench_core  # noqa: E402  (the README's Speed block)
import suite_counts  # noqa: E402  (the README's tests block: make test's recorded counts)
import report_kit as kit  # noqa: E402  (pages, the overview)
from safe_io import atomic_write  # noqa: E402  (imported after the sys.path set-up above)


def reports():
    """[(registry row, its report module demos/report_<script>.py)] in the registry's order."""
    return [(e, importlib.import_module(f"report_{e.script}")) for e in experiments.EXPERIMENTS]


def load_results(folder):
    """{name: payload} for every readable results_<name>.json in folder; warns about the rest."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "results_*.json"))):
        name = os.path.basename(path)[len("results_"):-len(".json")]
        try:
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
            if not isinstance(payload, dict) or "results" not in payload:
                raise ValueError("no 'results' key")
            out[name] = payload
        except (OSError, ValueError) as e:
            print(f"warning: skipping {os.path.relpath(path, ROOT)}: {e}", file=sys.stderr)
    return out


def render_all(folder, results):
    """Draw every figure whose results file is present; returns (written paths, number of failures)."""
    written, failures = [], 0
    for study, module in reports():
        payload = results.get(study.results)
        for fn in module.FIGURES if payload else []:
            try:
                written += fn(payload, payload["results"], folder)
            except Exception as e:  # one broken figure must not stop the others
                failures += 1
                print(f"warning: {fn.__name__} failed on results_{study.results}.json: {type(e).__name__}: {e}",
                      file=sys.stderr)
    return written, failures


def pages(results, docs_dir=DOCS):
    """({docs/<page>.md: text} of every study whose page could be generated, [studies that failed])."""
    out, failed = {}, []
    for study, module in reports():
        try:
            out[kit.page_path(study, docs_dir)] = kit.render_page(study, module, results.get(study.results))
        except Exception as e:  # a broken results file must not stop the other pages
            print(f"warning: page {study.page} failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(study.results)
    return out, failed


def _replace_block(text, tag, body):
    start = text.index(f"<!-- BEGIN GENERATED: {tag}")
    start = text.index("-->", start) + 3
    end = text.index(f"<!-- END GENERATED: {tag}", start)
    return text[:start] + "\n" + body.rstrip() + "\n" + text[end:]


def readme_text(folder, text, results):
    """README.md's text with its generated blocks (overview, speed, tests) rebuilt from folder's files."""
    text = _replace_block(text, "speed", report_bench_core.speed_block(folder))
    text = _replace_block(text, "tests", suite_counts.tests_block(folder))
    return _replace_block(text, "overview", kit.overview_block(folder, results, reports()))


def _read(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def generated(folder, readme=README, docs=DOCS):
    """({path: text} of the README and every page as the results in folder make them, [failed studies])."""
    results = load_results(folder)
    out, failed = pages(results, docs)
    out[readme] = readme_text(folder, _read(readme), results)
    return out, failed


def check(folder, readme=README, docs=DOCS):
    """--check-readme: 0 when the README's blocks and every page match the results files, 1 otherwise (a page
    stale, missing, without a study, or one that failed)."""
    files, failed = generated(folder, readme, docs)
    stale = [os.path.relpath(p, ROOT) for p, text in files.items() if _read(p) != text]
    stray = sorted(set(glob.glob(os.path.join(docs, "*.md"))) - set(files))
    if stale or stray:
        print("stale: " + ", ".join(stale + [os.path.relpath(p, ROOT) + " (no study)" for p in stray])
              + ": run python make_figures.py --readme")
        return 1
    if failed:
        print(f"the pages of {', '.join(failed)} cannot be generated from their results (see the warnings): "
              "rerun those experiments or fix their report modules")
        return 1
    print(f"README.md and {len(files) - 1} pages match the results files")
    return 0


def write(folder, readme=README, docs=DOCS):
    """--readme: rewrite the README's generated blocks and every page that changed; 1 if a page failed."""
    files, failed = generated(folder, readme, docs)
    changed = [p for p, text in files.items() if _read(p) != text]
    for path in changed:
        atomic_write(path, files[path])
    print(f"make_figures: {len(changed)} of {len(files)} files regenerated (README.md and docs/)"
          if changed else "make_figures: README.md and docs/ already up to date")
    if failed:
        print(f"make_figures: pages that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def draw(folder):
    """Render the figures and print one line per figure, its formats after it."""
    written, failures = render_all(folder, load_results(folder))
    figures = sorted({os.path.splitext(os.path.basename(w))[0] for w in written})
    for name in figures:
        exts = sorted(os.path.splitext(w)[1][1:] for w in written if os.path.basename(w).startswith(name + "."))
        print(f"  {name} ({', '.join(exts)})")
    print(f"make_figures: {len(figures)} figures ({len(written)} files) in {os.path.relpath(folder, ROOT)}"
          + (f"; {failures} figure(s) failed (see warnings)" if failures else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=FIG_DIR, help="folder with results_*.json; figures are written there")
    p.add_argument("--readme", action="store_true", help="regenerate docs/*.md and README.md's generated blocks")
    p.add_argument("--check-readme", action="store_true", help="exit 1 if a page or README block is out of date")
    p.add_argument("--no-plots", action="store_true", help="only the pages and the README")
    args = p.parse_args(argv)
    folder = os.path.abspath(args.dir)
    if not os.path.isdir(folder):
        print(f"error: no such folder {folder}", file=sys.stderr)
        return 2
    if args.check_readme:
        return check(folder)
    if not args.no_plots:
        draw(folder)
    return write(folder) if args.readme else 0


if __name__ == "__main__":
    sys.exit(main())
