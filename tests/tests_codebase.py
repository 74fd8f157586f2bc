"""Guards on the codebase itself: every experiment has a script, a report, a page and a QUICK test; no
function is over 60 lines; no module calls another's private name; the library's import graph has no cycle;
pyproject installs every library module; git ignores what the main job writes; and tools/compare_results.py
(the check that a refactor changed no number) can fail.

    python -m pytest tests/tests_codebase.py      (or: python tests/tests_codebase.py)
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)

import tests_studies  # noqa: E402  (the QUICK tests, one per study)
from tests_studies import _fake_checkout, report  # noqa: E402  (a stand-in checkout; a report module)

INTERFACE = ("QUESTION", "FIGURES", "page", "reading", "headline")   # what make_figures.py calls in a report


def t_every_experiment_has_a_script_a_report_a_page_and_a_quick_test():
    """Every row of demos/experiments.py: run_all runs its script (first, in the registry's order), its report
    module demos/report_<script>.py has the interface make_figures.py calls, its page docs/<page>.md exists in
    the registry's order and the README's overview links to it, and a t_<results name>_quick* test in
    tests/tests_studies.py runs its QUICK configuration; no report module or page belongs to no row."""
    import run_all
    rows = experiments.EXPERIMENTS
    for field in ("script", "results", "page", "heading"):
        assert len({getattr(e, field) for e in rows}) == len(rows), field
    assert [e.page for e in rows] == sorted(e.page for e in rows) and all(
        e.page.startswith(f"{i:02d}-") for i, e in enumerate(rows, 1)), [e.page for e in rows]
    found = run_all.discover()[:len(rows)]
    assert [n for n, _ in found] == [e.script for e in rows]
    assert not [n for n, script in found if script is None], f"missing demos/demo_<name>.py: {found}"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for e in rows:
        module = report(e.results)
        assert all(hasattr(module, name) for name in INTERFACE) and module.FIGURES, e
        assert os.path.exists(os.path.join(ROOT, "docs", e.page + ".md")) and f"(docs/{e.page}.md)" in readme, e
        assert any(n.startswith(f"t_{e.results}_quick") for n in vars(tests_studies)), f"no t_{e.results}_quick* test"
    reports = {os.path.basename(p)[len("report_"):-3] for p in glob.glob(os.path.join(ROOT, "demos", "report_*.py"))}
    assert reports - {e.script for e in rows} == {"kit", "property", "bench_core"}, reports
    pages = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    assert pages == {e.page for e in rows}, pages ^ {e.page for e in rows}


def t_git_commit_ignores_the_outputs_the_main_job_writes():
    """Results written by one experiment must not make the next one's git_commit '-dirty' (figures/, models/,
    docs/ and README.md are outputs); a changed script does."""
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("dropout",), extra={"figures/results_old.json": "{}", "README.md": "x\n",
                                                   "models/m.json": "{}", "docs/01-x.md": "x\n"})
        probe = [sys.executable, "-c", "import sys; sys.path.insert(0, 'demos'); import common; "
                                       "print(common.git_commit())"]

        def commit():
            return subprocess.run(probe, cwd=d, capture_output=True, text=True, check=True).stdout.strip()
        for rel in ("figures/results_old.json", "README.md", "models/m.json", "docs/01-x.md"):
            with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
                f.write("changed\n")
        assert not commit().endswith("-dirty"), commit()
        with open(os.path.join(d, "demos", "demo_dropout.py"), "a", encoding="utf-8") as f:
            f.write("# changed\n")
        assert commit().endswith("-dirty"), commit()


def t_no_function_in_the_library_or_demos_is_over_60_lines():
    """Every module of the project but the tests (top-level *.py, demos/, tools/): every function <= 60 lines."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import function_lengths
    files = function_lengths.project_files(ROOT)
    assert "make_figures.py" in files and "demos/report_kit.py" in files and not [f for f in files if "tests_" in f]
    too_long = [(n, where) for n, where in function_lengths.all_lengths(ROOT) if n > function_lengths.LIMIT]
    assert not too_long, too_long


def t_make_figures_is_a_short_command_line_and_the_reports_are_modules_of_moderate_size():
    """make_figures.py stays a command line (at most 250 lines: the studies' prose lives in their report
    modules); no module of demos/ or tools/ is over 1,500 lines."""
    def lines(path):
        with open(path, encoding="utf-8") as f:
            return len(f.read().splitlines())
    assert lines(os.path.join(ROOT, "make_figures.py")) <= 250
    paths = glob.glob(os.path.join(ROOT, "demos", "*.py")) + glob.glob(os.path.join(ROOT, "tools", "*.py"))
    sizes = {p: lines(p) for p in paths}
    assert not {p: n for p, n in sizes.items() if n > 1500}, sizes


def project_modules():
    """{module name: path} of every Python module of the project (top-level, demos/, tools/)."""
    paths = glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "demos", "*.py")) + glob.glob(
        os.path.join(ROOT, "tools", "*.py"))
    return {os.path.splitext(os.path.basename(p))[0]: p for p in paths}


def private_uses(source, modules, own):
    """['line: name'] where ``source`` (module ``own``) uses a private name (one leading underscore) of another
    project module: ``from m import _x``, or ``alias._x`` with alias bound by ``import m [as alias]`` or by
    ``alias = other.m`` (as ``core = common.core``)."""
    import ast
    tree, alias, out = ast.parse(source), {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            alias.update({a.asname or a.name: a.name for a in node.names if a.name in modules and a.name != own})
        elif isinstance(node, ast.ImportFrom) and node.module in modules and node.module != own:
            out += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Attribute) and node.value.attr in modules):
            alias[node.targets[0].id] = node.value.attr
    return out + [f"{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias
                  and node.attr.startswith("_") and not node.attr.startswith("__")]


def t_no_module_uses_a_private_name_of_another():
    """No module of the project (the library, make_figures.py, demos/, tools/; the tests may test private
    helpers) calls a private name of another project module, e.g. ``core._x``, ``chemdata._name`` or
    ``from report_kit import _x``; the check itself catches each form."""
    modules = project_modules()
    assert private_uses("import smiles_grammar as sg\nsg._token_class('C')\n", modules, "x") == ["2: sg._token_class"]
    assert private_uses("from report_kit import _x\n", modules, "x") == ["1: from report_kit import _x"]
    assert private_uses("import common\ncore = common.transformer\ncore._dot\n", modules, "x") == ["3: core._dot"]
    offenders = []
    for name, path in sorted(modules.items()):
        if not name.startswith("tests_"):
            with open(path, encoding="utf-8") as f:
                offenders += [f"{os.path.relpath(path, ROOT)}:{x}" for x in private_uses(f.read(), modules, name)]
    assert not offenders, offenders


def import_cycle(graph):
    """A cycle of ``graph`` ({module: set of modules}) as a list [a, b, ..., a], or None if it is acyclic."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None
    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def t_the_library_import_graph_has_no_cycle():
    """The import graph of the library modules at the root (imports inside functions included, since a lazy
    import is how a cycle hides) is acyclic, and every import in it can be followed; the check finds a lazy
    cycle and a dynamic import."""
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    lazy = "import os\nfrom b import x\ndef f():\n    import c.sub\n    import numpy\n"
    assert import_edges(lazy, {"a", "b", "c"}, "a") == {"b", "c"}
    assert import_edges("import importlib\nimportlib.import_module(name)\n", {"a"}, "b") == {"?"}
    modules = library_modules()
    assert {"chemdata", "predictor", "predict_files", "transformer"} <= set(modules) and "conftest" not in modules
    graph = {}
    for name, path in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            graph[name] = import_edges(f.read(), modules, name)
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    dynamic = sorted(name for name, edges in graph.items() if "?" in edges)
    assert not dynamic, f"a dynamic import the graph cannot follow in {dynamic}"


def t_compare_results_finds_a_changed_number_and_ignores_only_machine_fields():
    """tools/compare_results.py, the check that a refactor changed no number: a wall time, a speed, the host's
    matmul speed or a commit may differ, and a float by less than 1e-12 relative (summation-order noise); a
    float by more, an integer, a string or a missing key may not.  Two identical QUICK payloads compare as
    identical."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import compare_results as cr
    base = {"git_commit": "a", "wall_time_s": 1.0, "matmul_mflops": {"start": 98.0, "end": 60.0},
            "results": {"rmse": 0.5, "fit": {"test": [2.5, 3]}, "kl": {"score": 0.563870021},
                        "speed": {"n_tokens": 43, "tokens_per_s": 500.0}, "elapsed": 3.0, "betas": [0.9, 0.999]}}
    same = json.loads(json.dumps(base))
    same.update(git_commit="b", wall_time_s=9.0, matmul_mflops={"start": 210.0, "end": 190.0})
    same["results"]["speed"]["tokens_per_s"], same["results"]["elapsed"] = 100.0, 7.0
    same["results"]["kl"]["score"] = 0.563870021 + 1e-16                   # GuacaMol's last-bit noise
    same["results"]["rmse"] = 0.5 + 2 ** -53
    same["results"]["ngram"] = {"source": "elsewhere/results_smiles_lm.json"}     # a path naming the folder
    base["results"]["ngram"] = {"source": "figures/results_smiles_lm.json"}
    assert cr.diff(base, same) == []
    for change in (("rmse", 0.5000001), ("betas", [0.9, 0.99]), ("fit", {"test": [2.5, 4]}), ("fit", {"test": [2.5]})):
        other = json.loads(json.dumps(base))
        other["results"][change[0]] = change[1]
        assert [p for p, _, _ in cr.diff(base, other)], change
    other = json.loads(json.dumps(base))
    other["results"]["speed"]["n_tokens"] = 44
    assert [p for p, _, _ in cr.diff(base, other)] == ["$.results.speed.n_tokens"]
    data = {"delaney-processed.csv": "8c06a7", "uspto50k_liu2017_original/train_sources": "a1b2"}
    changed = dict(data, **{"delaney-processed.csv": "ffffff"})
    assert cr.diff(dict(base, data_sha256=data), dict(same, data_sha256=dict(data))) == []   # same data, same hash
    assert [p for p, _, _ in cr.diff(dict(base, data_sha256=data), dict(base, data_sha256=changed))] == [
        "$.data_sha256.delaney-processed.csv"]                             # a normal field: other data differ
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


def library_modules(root=ROOT):
    """{module name: path} of the library at the repository root: every top-level *.py but the tests and
    conftest.py."""
    paths = glob.glob(os.path.join(root, "*.py"))
    return {os.path.splitext(os.path.basename(p))[0]: p for p in paths
            if not os.path.basename(p).startswith("tests_") and os.path.basename(p) != "conftest.py"}


def import_edges(source, modules, own):
    """The modules of ``modules`` (names) that ``source`` (module ``own``) imports, wherever the import
    stands (inside a function too: a lazy import is still an edge), with ``importlib.import_module`` /
    ``__import__`` of a literal name or of an f-string's literal prefix; a dynamic import the graph cannot
    follow (a name computed at run time) counts as an edge to '?'.  Third-party and stdlib names are ignored."""
    import ast
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and node.args and (isinstance(node.func, ast.Name) and node.func.id ==
              "__import__" or isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value.split(".")[0])
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                found.update(m for m in modules if m.startswith(arg.values[0].value))
            else:
                found.add("?")
    return {m for m in found if m in modules or m == "?"} - {own}


def t_pyproject_installs_every_library_module_and_the_predict_command():
    """pyproject.toml's ``py-modules`` is the library at the root (all but make_figures.py, the command over
    demos/), each one a file; the console script is the predict command's ``main``."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    listed = re.findall(r'"(\w+)"', re.search(r"^py-modules = \[(.*?)\]", text, re.S | re.M).group(1))
    assert len(listed) == len(set(listed)) and set(listed) == set(library_modules()) - {"make_figures"}, listed
    assert re.search(r'^\[project\.scripts\]\n(#.*\n)*chem-transformer-predict = "predict_files:main"$', text, re.M)


def layout_paths(readme_text):
    """The paths named in the first column of the README's Layout table (between '## Layout' and the next
    '## ' heading), each a backticked name: a file, a folder ('docs/') or a pattern with one '<study>'."""
    section = readme_text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [p for cell in rows for p in re.findall(r"`([^`]+)`", cell)]


def layout_problems(paths, files, studies):
    """Which of ``files`` (paths relative to the root) no table entry names, and which entries name nothing.
    A pattern 'demos/demo_<study>.py' names the file of each study script in ``studies`` only."""
    named, problems = set(), []
    for p in paths:
        if "<study>" in p:
            hits = {p.replace("<study>", s) for s in studies} & set(files)
        elif p.endswith("/"):
            hits = {f for f in files if f.startswith(p)} or ({p} if os.path.isdir(os.path.join(ROOT, p)) else set())
        else:
            hits = {p} if os.path.exists(os.path.join(ROOT, p)) else set()
        problems += [] if hits else [f"the table names {p!r}, which is not there"]
        named |= hits
    return problems + [f"{f} is not in the README's Layout table" for f in files if f not in named]


def t_readme_layout_table_names_every_module():
    """Every module of the repository (the *.py files at the top and in demos/, tools/ and tests/, and the
    notebook) is named in the README's Layout table, by name or by the pattern of a study script, and every
    path the table names exists; the check itself catches a missing module and a stale entry."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        paths = layout_paths(f.read())
    files = sorted(os.path.relpath(p, ROOT) for pattern in ("*.py", "demos/*.py", "tools/*.py", "tests/*.py",
                                                            "demos/*.ipynb")
                   for p in glob.glob(os.path.join(ROOT, pattern)))
    studies = [e.script for e in experiments.EXPERIMENTS]
    assert layout_problems(paths, files, studies) == []
    assert layout_problems(paths, files + ["demos/new_helper.py"], studies) == [
        "demos/new_helper.py is not in the README's Layout table"]
    assert layout_problems(paths + ["gone.py"], files, studies) == ["the table names 'gone.py', which is not there"]


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
