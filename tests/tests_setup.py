"""Tests of the set-up and the console: tools/bootstrap.py (venv stamp, pip noise, finding the data), the
quiet imports and warning filters, conftest.py's recorded counts, run_all's --resume fast path, the README's
CSV predict example, and README.zh.md's map from the tutorial's sections to the code.

    python -m pytest tests/tests_setup.py
"""
import ast
import builtins
import csv
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "demos"))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bootstrap  # noqa: E402  (tools/bootstrap.py)
import chemdata  # noqa: E402  (imported after the sys.path set-up above)
import common  # noqa: E402  (demos/common.py)


def _have(module):
    return importlib.util.find_spec(module) is not None


needs_rdkit = pytest.mark.skipif(not _have("rdkit") and not os.environ.get("REQUIRE_CHEM"), reason="needs RDKit")


# ----------------------------------------------------------------------------- tools/bootstrap.py


def t_pip_noise_is_dropped_and_everything_else_kept():
    """The known lines of a successful install go; a line of any other shape stays, an unrelated ERROR too."""
    out = bootstrap.not_noise([
        "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a directory.",
        "ERROR: pip's dependency resolver does not currently take into account all the packages that are "
        "installed. This behaviour is the source of the following dependency conflicts.",
        "guacamol 0.5.5 requires rdkit-pypi>=2021.9.2.1, which is not installed.",
        "fcd 1.2.2 requires torch, which is not installed.",
        "ERROR: Could not find a version that satisfies the requirement nothing-here",
        ""])
    assert out == ["fcd 1.2.2 requires torch, which is not installed.",
                   "ERROR: Could not find a version that satisfies the requirement nothing-here"]


def t_failed_pip_step_shows_its_output_and_stops(capsys):
    with pytest.raises(SystemExit) as e:
        bootstrap.pip_step(sys.executable, 1, "a package that does not exist", ["--no-index", "--find-links",
                           tempfile.gettempdir(), "no-such-package-chem-transformer==0.0"], total=1)
    assert "failed" in str(e.value) and "no-such-package" in str(e.value)
    assert "no-such-package-chem-transformer" in capsys.readouterr().out     # pip's own words, unfiltered


def t_install_key_follows_pyproject_and_the_steps(monkeypatch):
    key = bootstrap.install_key()
    assert re.fullmatch(r"[0-9a-f]{64}", key) and bootstrap.install_key() == key
    monkeypatch.setattr(bootstrap, "PIP_STEPS", bootstrap.PIP_STEPS[:-1])
    assert bootstrap.install_key() != key


def _fake_data(monkeypatch, tmp, files=("a.csv", "sub/b.txt")):
    """A DATA_FILES of two small files; data/ and a 'shared' copy under tmp; returns their contents."""
    contents = {name: f"content of {name}\n".encode() for name in files}
    import hashlib
    monkeypatch.setattr(chemdata, "DATA_FILES", {n: {"sha256": hashlib.sha256(c).hexdigest(), "url": "x"}
                                                 for n, c in contents.items()})
    monkeypatch.setattr(chemdata, "data_dir", lambda: os.environ.get("CHEMDATA_DIR") or os.path.join(tmp, "data"))
    monkeypatch.setattr(bootstrap, "ROOT", os.path.join(tmp, "checkout"))    # no ../shared/data beside it
    monkeypatch.setenv("CHEMDATA_OFFLINE", "1")
    monkeypatch.delenv("CHEMDATA_DIR", raising=False)
    monkeypatch.setenv("CHEM_SHARED_DATA", os.path.join(tmp, "shared"))
    return contents


def _put(folder, contents):
    for name, data in contents.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def t_data_is_copied_from_the_shared_folder_then_found_in_data(monkeypatch, tmp_path, capsys):
    contents = _fake_data(monkeypatch, str(tmp_path))
    _put(str(tmp_path / "shared"), contents)
    assert bootstrap.cmd_data() == 0
    assert "copied 2 file(s)" in capsys.readouterr().out
    assert (tmp_path / "data" / "sub" / "b.txt").read_bytes() == contents["sub/b.txt"]
    assert bootstrap.cmd_data() == 0 and "all 2 files in data/" in capsys.readouterr().out


def t_missing_data_stops_with_one_message_naming_the_files_and_three_ways(monkeypatch, tmp_path, capsys):
    contents = _fake_data(monkeypatch, str(tmp_path))
    _put(str(tmp_path / "shared"), {"a.csv": b"a damaged copy\n"})        # wrong sha256: not copied
    _put(str(tmp_path / "data"), {"sub/b.txt": contents["sub/b.txt"]})
    assert bootstrap.cmd_data() == 1
    err = capsys.readouterr().err
    assert "1 data file(s) missing from data/: a.csv." in err and "sub/b.txt" not in err
    assert "CHEMDATA_DIR" in err and "cp -r ../shared/data/. data/" in err and "chemdata.py fetch" in err


def t_chemdata_dir_must_be_complete(monkeypatch, tmp_path, capsys):
    contents = _fake_data(monkeypatch, str(tmp_path))
    _put(str(tmp_path / "mine"), contents)
    monkeypatch.setenv("CHEMDATA_DIR", str(tmp_path / "mine"))
    assert bootstrap.cmd_data() == 0 and "CHEMDATA_DIR=" in capsys.readouterr().out
    os.remove(tmp_path / "mine" / "a.csv")
    assert bootstrap.cmd_data() == 1 and "missing from CHEMDATA_DIR=" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()                  # nothing copied beside a folder the user chose


# ----------------------------------------------------------------------------- a quiet console


def t_third_party_warnings_are_ignored_and_ours_are_not():
    """demos/common.py's filters ignore each listed warning raised from its package, not from ours; pytest
    parses the same list (conftest.py)."""
    from _pytest.config import parse_warning_filter
    for spec in common.third_party_warning_specs():
        parse_warning_filter(spec, escape=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        common.quiet_third_party_warnings()
        for message, category, package in common.THIRD_PARTY_WARNINGS:
            cat = getattr(builtins, category)
            warnings.warn_explicit(message + " (test)", cat, "x.py", 1, module=package + ".sub")
            warnings.warn_explicit(message + " (test)", cat, "x.py", 1, module="chemdata")
    assert len(caught) == len(common.THIRD_PARTY_WARNINGS), [str(w.message) for w in caught]


def t_import_deepchem_prints_nothing():
    if not _have("deepchem"):
        pytest.skip("DeepChem is not installed")
    proc = subprocess.run([sys.executable, "-c", "import chemdata; print(chemdata.import_deepchem().__version__)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
    assert proc.stdout.strip().count("\n") == 0          # the version, nothing else


@needs_rdkit
def t_morgan_fingerprints_equal_rdkits_legacy_bits_on_esol_and_hopv():
    """chemdata.morgan_fingerprints (rdFingerprintGenerator) gives, on every ESOL and HOPV molecule, the
    bits of the deprecated GetMorganFingerprintAsBitVect that DeepChem's ECFP featurizer calls."""
    from rdkit import Chem
    from rdkit.Chem import rdMolDescriptors
    smiles = chemdata.load_esol(download=False).smiles + chemdata.load_hopv(download=False).smiles
    ours = chemdata.morgan_fingerprints(smiles, radius=2, n_bits=1024)
    with chemdata.quiet_rdkit():
        legacy = [list(rdMolDescriptors.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles(s), 2, nBits=1024))
                  for s in smiles]
    assert len(smiles) == 1128 + 233 and ours == legacy          # ESOL, HOPV rows with the gap


def t_kl_score_outside_the_reference_warns_nothing_and_says_why():
    """Samples with no value inside the reference's bins of a discrete descriptor: guacamol's histogram is
    0 / 0; the score is None with the descriptor named, and numpy warns nothing."""
    import generation_metrics as gm
    if not gm.distribution_packages_available():
        pytest.skip("guacamol / fcd are not installed")
    reference = ["CCO", "CCCN", "CCN(C)C", "COC", "CC(C)O", "CCCCCl", "CCCOC", "OCC(N)O", "CCBr", "NCCS"]
    samples = ["c1ccc2ccccc2c1", "c1ccc(cc1)-c1ccccc1O", "c1ccc2cc3ccccc3cc2c1N", "Cc1ccc2ccccc2c1F"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = gm.guacamol_kl_score(samples, reference)
    assert out["score"] is None and "NumAromaticRings" in out["error"], out


# ----------------------------------------------------------------------------- pytest: counts recorded


def t_record_tests_writes_the_counts(tmp_path):
    out = tmp_path / "counts.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/tests_setup.py",
                           "-k", "pip_noise_is_dropped", f"--record-tests={out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert (r["passed"], r["failed"], r["errors"], r["skipped"]) == (1, 0, 0, 0), r
    assert r["deselected"] >= 5 and r["selection"] == "not slow" and r["wall_time_s"] > 0, r
    assert set(r["load_average_1min"]) == {"start", "end"} and r["cpu_count"] >= 1
    assert re.search(r"\b1 passed\b", proc.stdout)


def t_readme_tests_block_is_rendered_from_the_records(tmp_path):
    import suite_counts
    assert "No recorded run yet" in suite_counts.tests_block(str(tmp_path))
    rec = {"passed": 7, "failed": 1, "errors": 1, "skipped": 0, "deselected": 3, "wall_time_s": 90.0,
           "load_average_1min": {"start": 0.5, "end": 2.5}, "cpu_count": 2, "python": "3.11.7",
           "implementation": "CPython", "git_commit": "0123456789abcdef"}
    for kind in ("fast", "slow"):
        (tmp_path / f"tests_{kind}.json").write_text(json.dumps(rec))
    rows = [x for x in suite_counts.tests_block(str(tmp_path)).splitlines() if x.startswith("| `python")]
    assert len(rows) == 2 and "| 7 | 2 | 0 | 3 | 1.5 min | 0.5 → 2.5 (busy) |" in rows[0], rows


# ----------------------------------------------------------------------------- run_all --resume


_FAKE_DEMO = '''import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
args, config, run = common.start(os.path.basename(__file__)[5:-3], "fake", {"n": 1}, {"n": 0})
run.finish({"checks": {"ok": True}})
'''
_FAKE_MAKE_FIGURES = '''import os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures_made"), "a") as f:
    f.write("x")
'''


def _checkout(folder):
    """A committed git checkout with run_all.py and its imports, two fake demos and a fake make_figures.py."""
    os.makedirs(os.path.join(folder, "demos"))
    files = {rel: open(os.path.join(ROOT, rel), encoding="utf-8").read()
             for rel in ("demos/run_all.py", "demos/common.py", "demos/experiments.py", "transformer.py", "safe_io.py")}
    files.update({"demos/demo_dropout.py": _FAKE_DEMO, "demos/demo_positional.py": _FAKE_DEMO,
                  "make_figures.py": _FAKE_MAKE_FIGURES})
    for rel, text in files.items():
        with open(os.path.join(folder, rel), "w", encoding="utf-8") as f:
            f.write(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "fake"]):
        subprocess.run(git + cmd, cwd=folder, check=True, capture_output=True)


def t_resume_with_everything_current_does_nothing_but_say_so():
    with tempfile.TemporaryDirectory() as d:
        _checkout(d)
        env = dict(os.environ, RESULTS_DIR=os.path.join(d, "out"))
        env.pop("QUICK", None)
        cmd = [sys.executable, os.path.join(d, "demos", "run_all.py"), "--quick", "--only", "dropout,positional"]
        first = subprocess.run(cmd, env=env, cwd=d, capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        summary = os.path.join(d, "out", "run_all_summary.json")
        before = os.stat(summary).st_mtime_ns
        t0 = time.perf_counter()
        again = subprocess.run(cmd + ["--resume"], env=env, cwd=d, capture_output=True, text=True, timeout=600)
        took = time.perf_counter() - t0
        assert again.returncode == 0 and "everything is current" in again.stdout, again.stdout + again.stderr
        assert open(os.path.join(d, "figures_made")).read() == "x"        # make_figures ran once, not twice
        assert os.stat(summary).st_mtime_ns == before and took < 10, took
        os.utime(os.path.join(d, "out", "results_dropout.json"))          # a results file changed
        third = subprocess.run(cmd + ["--resume"], env=env, cwd=d, capture_output=True, text=True, timeout=600)
        assert "results files changed since the figures were made" in third.stdout, third.stdout
        assert open(os.path.join(d, "figures_made")).read() == "xx"


# ----------------------------------------------------------------------------- the README's examples


def _readme_csv_command():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"<!-- predict CSV example:[^\n]*-->\n```bash\n(.*?)```", text, re.S).group(1)
    line = next(x for x in block.splitlines() if "--csv" in x)
    return shlex.split(line.split("#")[0])


@needs_rdkit
def t_readme_predict_csv_example_runs_as_written():
    """The README's --csv command, as written (``chem-transformer-predict``, run as its checkout form ``python
    predict_files.py``), on the example file shipped in examples/: every row comes back with its prediction;
    the deliberately broken SMILES is 'invalid'."""
    argv = _readme_csv_command()
    assert argv[0] == "chem-transformer-predict" and "examples/molecules.csv" in argv
    proc = subprocess.run([sys.executable, "predict_files.py", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    with open(os.path.join(ROOT, "examples", "molecules.csv"), encoding="utf-8") as f:
        names = [r["name"] for r in csv.DictReader(f)]
    assert [r["name"] for r in rows] == names and len(names) >= 5
    assert all(r["status"] == "ok" for r in rows[:-1]) and rows[-1]["status"] == "invalid", rows
    assert all(r["prediction_log10(mol/L)"] for r in rows[:-1])


# ----------------------------------------------------------------------------- README.zh.md


def _zh_rows():
    text = open(os.path.join(ROOT, "README.zh.md"), encoding="utf-8").read()
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("| 教程 |")) + 2   # the map, after its header
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("| ")), len(lines))
    table = lines[start:end]
    return text, [[c.strip() for c in x.strip().strip("|").split(" | ")] for x in table]


def _resolve(name):
    """module.attr[.attr]: the object, importing the module from the root or demos/."""
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for attr in parts[1:]:
        obj = getattr(obj, attr)
    return obj


def _defines(path, func):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body)


def t_readme_zh_maps_every_section_to_code_that_exists():
    text, rows = _zh_rows()
    assert len(rows) >= 25 and len({r[0] for r in rows}) == len(rows), [r[0] for r in rows]
    for section, what, funcs, test, demo, figure in rows:
        assert re.fullmatch(r"(§\d+(\.\d+)* )?式 \([0-9.–、() ]+\)|§\d+(\.\d+)*|附录 [A-Z]", section), section
        if "未实现" in what:                               # the tutorial's topic this project does not implement
            assert funcs == test == demo == figure == "—", section
            continue
        for name in re.findall(r"`([^`]+)`", funcs):
            assert callable(_resolve(name)), name
        path, func = re.fullmatch(r"`((?:tests/)?tests_\w+\.py)::(t_\w+)`", test).groups()
        assert _defines(path, func), test
        for cell, folder in ((demo, "demos/"), (figure, "figures/")):
            if cell != "—":
                rel = re.fullmatch(r"`([^`]+)`", cell).group(1)
                assert rel.startswith(folder) and os.path.isfile(os.path.join(ROOT, rel)), rel
    for link in re.findall(r"\]\(([^)]+)\)", text):
        assert os.path.isfile(os.path.join(ROOT, link)), link
    assert "[README.md](README.md)" in "\n".join(text.splitlines()[:5])
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "](README.zh.md)" in "\n".join(f.read().splitlines()[:12])


def t_readme_zh_carries_no_result_numbers():
    """Outside code spans, code blocks and links, the only numbers are the table's equation and section
    numbers, versions (Python 3.11 / 3.12, DeepChem 2.8), small counts and names (USPTO-50K, sha256):
    results live on the generated pages in docs/."""
    text, rows = _zh_rows()
    sections = {n for r in rows for n in re.findall(r"\d+(?:\.\d+)*", r[0])}
    prose = re.sub(r"```.*?```|`[^`]*`|\([^)]*\.md\)", "", text, flags=re.S)
    numbers = set(re.findall(r"\d+(?:\.\d+)*", prose))
    allowed = sections | {"3.11", "3.12", "2.8", "50", "256"} | {str(i) for i in range(13)}
    assert numbers <= allowed, sorted(numbers - allowed)
