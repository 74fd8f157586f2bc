"""Tests of chemdata.py: tokenizers, vocabularies, loaders, splits, featurizers, metrics.

Run with ``python -m pytest tests/tests_chemdata.py`` or ``python tests/tests_chemdata.py``.
The data files must be in the data folder (``data/`` or ``$CHEMDATA_DIR``);
the tests never download anything.  Tests that need RDKit or DeepChem skip
when those packages are missing (``pip install -e ".[chem]"``).
"""

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import urllib.error

import chemdata
import formulas
import evaluation
import property_features
import reactions

try:
    import pytest
    slow = pytest.mark.slow       # over about 20 s: run by `python -m pytest -m slow` and `make test`
except ImportError:               # the plain runner (python tests_x.py) needs no pytest
    def slow(test):
        return test

HARD_SMILES = ["[C@@H]", "[N+](=O)[O-]", "C%12CC%12", "Br/C=C/Cl", "[2H]C", "c1ccc2[nH]ccc2c1"]

# The atom-level vocabulary of the 902 ESOL training SMILES of the scaffold
# split, in Vocab.build order (most frequent first).
ESOL_SCAFFOLD_TRAIN_TOKENS = [
    "C", "c", "(", ")", "O", "1", "=", "Cl", "N", "2", "3", "n", "S", "4", "Br", "F",
    "P", "#", "[nH]", "I", "/", "o", "5", "\\", "6", "7", "8", "s"]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _chem_required():
    """CI sets REQUIRE_CHEM=1: a missing RDKit or DeepChem is then an error, not a skip."""
    return os.environ.get("REQUIRE_CHEM", "").strip().lower() in ("1", "true", "yes")


def _need_rdkit():
    if not chemdata.rdkit_available():
        if _chem_required():
            raise ImportError("REQUIRE_CHEM=1 but rdkit is not importable: pip install -e '.[chem]'")
        raise unittest.SkipTest("rdkit not installed: pip install -e '.[chem]'")


def _need_deepchem():
    try:
        import deepchem
    except ImportError:
        if _chem_required():
            raise
        raise unittest.SkipTest("deepchem not installed: pip install -e '.[chem]' (Python < 3.12)") from None
    return deepchem


@contextlib.contextmanager
def _env(**values):
    """Set (str) or unset (None) environment variables inside a with block."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _patched(obj, name, value):
    """Temporarily replace attribute ``name`` of ``obj``."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def _no_network(url):
    raise AssertionError(f"a test tried to download {url}")


def _raises(exception, function, *args, **kwargs):
    """Call function and return the exception it raises (fail if it raises none)."""
    try:
        function(*args, **kwargs)
    except exception as exc:
        return exc
    raise AssertionError(f"{function.__name__}{args} did not raise {exception.__name__}")


_CACHE = {}


def _cached(name, function, *args, **kwargs):
    """Compute an expensive value once per test session."""
    if name not in _CACHE:
        _CACHE[name] = function(*args, **kwargs)
    return _CACHE[name]


def _esol():
    return _cached("esol", chemdata.load_esol, download=False)


def _uspto():
    return _cached("uspto", chemdata.load_uspto50k, download=False)


def _esol_scaffold_split():
    return _cached("esol_scaffold", chemdata.scaffold_split, _esol().smiles)


# ---------------------------------------------------------------------------
# module rules
# ---------------------------------------------------------------------------

TOPIC_MODULES = ("evaluation", "property_features", "smiles_grammar", "generation_metrics", "predictor",
                 "predict_files", "reactions")


def _modules():
    """chemdata, the formulas module below it, and the topic modules, imported."""
    return [chemdata, formulas] + [importlib.import_module(name) for name in TOPIC_MODULES]


def t_module_level_imports_are_standard_library():
    """chemdata and the topic modules import only the standard library and the project's own modules at
    module level; importing them loads no numpy, RDKit, DeepChem or torch."""
    allowed = set(sys.stdlib_module_names) | {"transformer", "safe_io", "chemdata", "formulas"} | set(TOPIC_MODULES)
    for module in _modules():
        with open(module.__file__, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"module-level import of {name} in {module.__name__}"
    code = (f"import sys, chemdata, {', '.join(TOPIC_MODULES)}; "
            "print([m for m in ('numpy', 'rdkit', 'deepchem', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(chemdata.__file__)), check=True)
    assert out.stdout.strip() == "[]", out.stdout
    code = "import sys, chemdata; print(sorted(m for m in sys.modules if m in %r))" % (TOPIC_MODULES,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(chemdata.__file__)), check=True)
    assert out.stdout.strip() == "[]", f"import chemdata loaded topic modules: {out.stdout}"


def _public_definitions(module):
    """Public names a module defines at its top level (functions, classes, assignments), read from its source."""
    with open(module.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [t.id for t in targets if isinstance(t, ast.Name)]
    return [name for name in out if not name.startswith("_")]


def t_every_module_lists_its_public_names_in_all():
    """Each module's ``__all__`` names exist, without repeats, and cover every public name it defines."""
    for module in _modules():
        names = module.__all__
        assert len(names) == len(set(names)), (module.__name__, sorted(n for n in names if names.count(n) > 1))
        assert [n for n in names if not hasattr(module, n)] == [], module.__name__
        own = set(_public_definitions(module))
        assert own - set(names) == set(), (module.__name__, sorted(own - set(names)))


def t_a_name_that_moved_is_an_attribute_error_naming_its_module():
    """``chemdata.rmse`` (a name chemdata used to re-export) is an AttributeError that names the module holding
    it, for every such name; chemdata lists none of them, never imports a topic module to answer, and an
    unknown name is the plain AttributeError.  The topic modules import in any order with chemdata."""
    assert tuple(chemdata._MOVED) == ("formulas",) + TOPIC_MODULES
    listing = set(dir(chemdata)) | set(chemdata.__all__)
    for name, names in chemdata._MOVED.items():
        module = importlib.import_module(name)
        for attr in names:
            assert attr in module.__all__, (name, attr)
            e = _raises(AttributeError, getattr, chemdata, attr)
            assert str(e) == (f"module 'chemdata' has no attribute {attr!r}: it lives in {name} "
                              f"(import {name}; {name}.{attr})"), str(e)
            assert not hasattr(chemdata, attr) and attr not in listing, attr
    assert "rmse" in chemdata._MOVED["evaluation"] and "load_predictor" in chemdata._MOVED["predictor"]
    assert str(_raises(AttributeError, getattr, chemdata, "no_such_name")) == \
        "module 'chemdata' has no attribute 'no_such_name'"
    assert not hasattr(chemdata, "_token_class") and not hasattr(chemdata, "_scan_csv")    # no back door
    here = os.path.dirname(os.path.abspath(chemdata.__file__))
    code = ("import sys, chemdata\n"
            "try:\n    chemdata.rmse\nexcept AttributeError as e:\n    print(e)\n"
            "print(sorted(m for m in sys.modules if m in %r))" % (TOPIC_MODULES,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here, check=True)
    assert out.stdout.splitlines() == ["module 'chemdata' has no attribute 'rmse': it lives in evaluation "
                                       "(import evaluation; evaluation.rmse)", "[]"], out.stdout
    for first in TOPIC_MODULES + ("chemdata",):
        code = (f"import {first}, chemdata, smiles_grammar, predictor, predict_files; "
                "assert predict_files.load_predictor is predictor.load_predictor; "
                "assert predict_files.DatasetFormatError is chemdata.DatasetFormatError; print('ok')")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (first, out.stderr)


def t_every_chemdata_name_the_project_uses_resolves():
    """Every ``chemdata.X`` / ``cd.X`` in the project's Python files, notebooks and Markdown (but chemdata.py
    and this file, which show the moved-name error) resolves in chemdata itself: a topic module's name is
    reached through its own module (``evaluation.rmse``), so no caller depends on a name chemdata does not hold."""
    root = os.path.dirname(os.path.abspath(chemdata.__file__))
    pattern = re.compile(r"\b(?:cd|chemdata)\.([A-Za-z_]\w*)")
    skip = {os.path.abspath(chemdata.__file__), os.path.abspath(__file__)}
    used = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("data", "__pycache__", "node_modules")]
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith((".py", ".ipynb", ".md")) and os.path.abspath(path) not in skip:
                with open(path, encoding="utf-8") as f:
                    text = f.read().replace('"kind": "chemdata.Predictor"', "")    # a model file's format tag
                for attr in pattern.findall(text):
                    used.setdefault(attr, os.path.relpath(path, root))
    assert "load_esol" in used and "Vocab" in used, sorted(used)
    for placeholder in ("py", "NAME", "X", "_name"):      # "chemdata.py", and placeholders in docstrings
        used.pop(placeholder, None)
    unresolved = {attr: path for attr, path in used.items() if not hasattr(chemdata, attr)}
    assert not unresolved, unresolved


def t_script_entry_runs_the_imported_module():
    """``python chemdata.py ...`` runs as module ``__main__``, a second copy of chemdata: the entry must call
    the real module's ``main`` (one set of classes shared with the topic modules), not its own copy's."""
    here = os.path.dirname(os.path.abspath(chemdata.__file__))
    code = ("import runpy, sys, chemdata\n"
            "calls = []\n"
            "chemdata.main = lambda argv=None: calls.append(argv) or 7\n"
            "sys.argv = ['chemdata.py', 'check']\n"
            "try:\n    runpy.run_path(chemdata.__file__, run_name='__main__')\n"
            "except SystemExit as e:\n    print(calls, e.code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here)
    assert out.stdout.strip() == "[None] 7", (out.stdout, out.stderr)


def t_public_functions_have_docstrings():
    for module in _modules():
        assert module.__doc__, f"{module.__name__} has no module docstring"
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if callable(obj):
                assert obj.__doc__, f"{module.__name__}.{name} has no docstring"


def t_missing_rdkit_gives_install_hint():
    saved = {m: sys.modules[m] for m in list(sys.modules) if m == "rdkit" or m.startswith("rdkit.")}
    sys.modules["rdkit"] = None   # makes "from rdkit import Chem" fail like a missing package
    try:
        exc = _raises(ImportError, chemdata.is_valid_smiles, "CCO")
        assert 'pip install -e ".[chem]"' in str(exc)
        assert chemdata.canonical_smiles(" CCO ") == "CCO"   # falls back to string identity
        _raises(ImportError, chemdata.canonical_smiles, "CCO", require_rdkit=True)
    finally:
        del sys.modules["rdkit"]
        sys.modules.update(saved)


# ---------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------

def t_tokenize_smiles_hard_cases():
    expected = {
        "[C@@H]": ["[C@@H]"],
        "[N+](=O)[O-]": ["[N+]", "(", "=", "O", ")", "[O-]"],
        "C%12CC%12": ["C", "%12", "C", "C", "%12"],
        "Br/C=C/Cl": ["Br", "/", "C", "=", "C", "/", "Cl"],
        "[2H]C": ["[2H]", "C"],
        "c1ccc2[nH]ccc2c1": ["c", "1", "c", "c", "c", "2", "[nH]", "c", "c", "c", "2", "c", "1"],
        "CC(=O)O.OCC>>CC(=O)OCC": ["C", "C", "(", "=", "O", ")", "O", ".", "O", "C", "C", ">>",
                                  "C", "C", "(", "=", "O", ")", "O", "C", "C"],
        "CC>O>CO": ["C", "C", ">", "O", ">", "C", "O"],
        "[Si](C)(C)C#N": ["[Si]", "(", "C", ")", "(", "C", ")", "C", "#", "N"],
        "F/C=C\\F": ["F", "/", "C", "=", "C", "\\", "F"],
        "[CH3:1][NH3+]": ["[CH3:1]", "[NH3+]"],
        "c1ccoc1$*": ["c", "1", "c", "c", "o", "c", "1", "$", "*"],
    }
    for smiles, tokens in expected.items():
        assert chemdata.tokenize_smiles(smiles) == tokens, smiles
        assert "".join(tokens) == smiles
    assert chemdata.tokenize_smiles("") == []


def t_tokenize_smiles_unknown_character_raises():
    for smiles, char, position in [("CC(C)Cl x", " ", 7), ("C[nH", "[", 1), ("CCl?", "?", 3),
                                   ("Cu", "u", 1), ("CC ", " ", 2)]:
        exc = _raises(ValueError, chemdata.tokenize_smiles, smiles)
        assert repr(char) in str(exc) and f"position {position}" in str(exc), str(exc)


def t_tokenize_chars():
    assert chemdata.tokenize_chars("CCl") == ["C", "C", "l"]
    assert chemdata.tokenize_chars("") == []


def t_cl_and_br_are_single_tokens():
    assert chemdata.tokenize_smiles("ClCBr") == ["Cl", "C", "Br"]
    assert chemdata.tokenize_smiles("c1ccc(Cl)cc1Br").count("Cl") == 1
    assert "l" not in chemdata.tokenize_smiles("ClC(Cl)(Cl)Cl")


def t_smiles_round_trip_on_all_datasets():
    esol = _esol()
    hopv_columns = chemdata._read_columns(chemdata.data_path("hopv.csv", download=False), ["smiles"])
    hopv_smiles = [s.strip() for s in hopv_columns["smiles"]]
    assert len(hopv_smiles) == 350
    reactions = _uspto().reactions
    for s in esol.smiles + hopv_smiles + reactions:
        assert "".join(chemdata.tokenize_smiles(s)) == s, s


def t_esol_vocabulary_has_28_tokens():
    esol = _esol()
    every = chemdata.Vocab.build(chemdata.tokenize_smiles(s) for s in esol.smiles)
    assert sorted(every.tokens) == sorted(ESOL_SCAFFOLD_TRAIN_TOKENS)
    assert "Cl" in every and "Br" in every and "l" not in every and "r" not in every


def t_esol_scaffold_train_vocabulary_exact():
    _need_rdkit()
    esol = _esol()
    train, valid, test = _esol_scaffold_split()
    vocab = chemdata.Vocab.build(chemdata.tokenize_smiles(esol.smiles[i]) for i in train)
    assert vocab.tokens == ESOL_SCAFFOLD_TRAIN_TOKENS, vocab.tokens
    for i in valid + test:   # no <unk> on the held-out molecules
        vocab.encode(chemdata.tokenize_smiles(esol.smiles[i]))
    assert vocab.unk_count == 0


# ---------------------------------------------------------------------------
# formulas
# ---------------------------------------------------------------------------

def t_formula_tokenize_and_parse():
    assert formulas.tokenize_formula("Mg2Si") == ["Mg", "2", "Si"]
    assert formulas.tokenize_formula("Fe0.5Ni0.5") == ["Fe", "0.5", "Ni", "0.5"]
    cases = {
        "Cu3Sn4U3": {"Cu": 3, "Sn": 4, "U": 3},
        "C1Pt1": {"C": 1, "Pt": 1},
        "Fe0.5Ni0.5": {"Fe": 0.5, "Ni": 0.5},
        "Ca3(PO4)2": {"Ca": 3, "P": 2, "O": 8},
        "Mg(OH)2": {"Mg": 1, "O": 2, "H": 2},
        "K4[Fe(CN)6]": {"K": 4, "Fe": 1, "C": 6, "N": 6},
        "CH3COOH": {"C": 2, "H": 4, "O": 2},
        "Co": {"Co": 1},
        "CO": {"C": 1, "O": 1},
    }
    for formula, composition in cases.items():
        assert formulas.parse_formula(formula) == composition, formula
    assert formulas.reduced_formula("Ca2F12Ti2") == "CaF6Ti"
    assert formulas.reduced_formula("Fe0.5Ni0.5") == "FeNi"
    assert formulas.reduced_formula("O3Fe2") == "Fe2O3"
    assert formulas.reduced_formula("Fe0.25Ni0.5O2") == "FeNi2O8"
    for bad in ["Xx2", "Fe(", "Fe)", "(Fe]", "2Fe", "Fe0", "Fe-2", "", "Na Cl", "fe"]:
        _raises(ValueError, formulas.parse_formula, bad)
    assert "Xx" in str(_raises(ValueError, formulas.tokenize_formula, "Xx2"))


def t_element_fractions():
    assert len(formulas.ELEMENTS) == 118 and formulas.ELEMENTS[82] == "Bi"
    assert len(formulas.FRACTION_ELEMENTS) == 89
    for formula in ["Mg2Si", "Cu3Sn4U3", "Fe0.5Ni0.5", "Ca3(PO4)2", "Pu1O2"]:
        vector = formulas.element_fractions(formula)
        assert len(vector) == 89 and abs(sum(vector) - 1) < 1e-12, formula
    vector = formulas.element_fractions("Fe2O3")
    assert vector[formulas.FRACTION_ELEMENTS.index("Fe")] == 0.4
    assert vector[formulas.FRACTION_ELEMENTS.index("O")] == 0.6
    assert formulas.element_fractions("H2O", elements=["O", "H"]) == [1 / 3, 2 / 3]
    assert "Am" in str(_raises(ValueError, formulas.element_fractions, "Am1O2"))


# ---------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------

def t_vocab():
    vocab = chemdata.Vocab.build([["C", "C", "O"], ["C", "N"], ["N"]])
    assert vocab.itos == ["<pad>", "<bos>", "<eos>", "<unk>", "C", "N", "O"]
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
    assert len(vocab) == 7
    ids = vocab.encode(["C", "O", "Br", "Br"])
    assert ids == [1, 4, 6, 3, 3, 2]
    assert vocab.unk_count == 2 and vocab.unknown_tokens["Br"] == 2
    assert vocab.encode(["N"], add_bos_eos=False) == [5]
    assert vocab.decode(ids) == ["C", "O", "<unk>", "<unk>"]
    assert vocab.decode([1, 4, 2, 0, 0], strip_special=False) == ["<bos>", "C", "<eos>", "<pad>", "<pad>"]
    _raises(ValueError, vocab.decode, [99])
    again = chemdata.Vocab.from_json(vocab.to_json())
    assert again.itos == vocab.itos
    assert chemdata.Vocab.build([["C", "O"]], min_freq=2).tokens == []
    _raises(ValueError, chemdata.Vocab, ["C", "<unk>"])
    _raises(ValueError, chemdata.Vocab.from_json, '{"itos": ["C"]}')
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "vocab.json")
        vocab.save(path)
        assert chemdata.Vocab.load(path).itos == vocab.itos


# ---------------------------------------------------------------------------
# data files and loaders
# ---------------------------------------------------------------------------

def t_local_data_files_match_manifest():
    report = chemdata.check_data_files()
    for name in ["delaney-processed.csv", "hopv.csv", "mp_e_form.csv", "USPTO_50K.csv"]:
        assert report[name] == "ok", (name, report[name])
    for name, status in report.items():
        assert status in ("ok", "missing"), (name, status)


def t_data_dir_follows_environment():
    with _env(CHEMDATA_DIR="/some/where"):
        assert chemdata.data_dir() == os.path.abspath("/some/where")
    with _env(CHEMDATA_DIR=None):
        here = os.path.dirname(os.path.abspath(chemdata.__file__))
        assert chemdata.data_dir() == os.path.join(here, "data")
    with _env(CHEMDATA_OFFLINE="1"):
        assert not chemdata.downloads_enabled() and chemdata.downloads_enabled(True)
    with _env(CHEMDATA_OFFLINE=None):
        assert chemdata.downloads_enabled() and not chemdata.downloads_enabled(False)


def t_load_esol():
    esol = _esol()
    assert len(esol) == len(esol.y) == 1128
    assert esol.info["n_stripped"] == 212
    assert all(s == s.strip() for s in esol.smiles)
    assert esol.smiles[0] == "OCC3OC(OCC2OC(OC(C#N)c1ccccc1)C(O)C(O)C2O)C(O)C(O)C3O"
    assert esol.y[0] == -0.77 and min(esol.y) == -11.6 and max(esol.y) == 1.58


def t_load_hopv():
    hopv = chemdata.load_hopv(download=False)
    assert (hopv.info["n_rows"], hopv.info["n_dropped"], len(hopv)) == (350, 117, 233)
    assert all(math.isfinite(v) for v in hopv.y)
    assert len(chemdata.load_hopv("PCE", download=False)) == 343
    _raises(ValueError, chemdata.load_hopv, "homo")
    assert chemdata._finite(["1.5", "", "nan", "inf", None, 2, "-3"]) == ([0, 5, 6], [1.5, 2.0, -3.0], 4)
    _raises(chemdata.DatasetFormatError, chemdata._finite, ["1", "abc"])


def t_load_mp_formation_energy():
    mp = chemdata.load_mp_formation_energy(download=False)
    assert len(mp) == len(mp.y) == 132_752
    # the file is sorted by target; the loader must have shuffled it
    tenth = len(mp) // 10
    assert abs(sum(mp.y[:tenth]) / tenth - sum(mp.y) / len(mp)) < 0.05
    small = chemdata.load_mp_formation_energy(n=100, seed=0, download=False)
    assert small.formulas == mp.formulas[:100] and small.y == mp.y[:100]
    other = chemdata.load_mp_formation_energy(n=100, seed=1, download=False)
    assert other.formulas != small.formulas
    report = chemdata.duplicate_report(mp.formulas)
    assert (report["n_unique"], report["n_repeats"]) == (106_250, 26_502)
    elements = {e for f in set(mp.formulas) for e in formulas.parse_formula(f)}
    assert len(elements) == 84 and elements <= set(formulas.FRACTION_ELEMENTS)
    assert round(min(mp.y), 3) == -4.612 and 2.49 < max(mp.y) < 2.5


def t_mp_tutorial_slice_rows_and_split_sizes():
    """The tutorial's experiment-7 slice: the first 16,000 rows of the file as shipped, shuffled, split
    8000/1000/2000; its mean baseline reproduces the tutorial's test RMSE of 0.536 eV/atom."""
    data, (train, valid, test) = chemdata.mp_tutorial_slice(seed=0, download=False)
    assert len(data) == chemdata.MP_TUTORIAL_ROWS == 16_000 and data.info["head"] == 16_000
    assert (len(train), len(valid), len(test)) == chemdata.MP_TUTORIAL_SIZES == (8000, 1000, 2000)
    assert not (set(train) & set(valid) or set(train) & set(test) or set(valid) & set(test))
    cols = chemdata._read_columns(chemdata.data_path("mp_e_form.csv", download=False), ["formula", "target"])
    shipped = sorted(zip(cols["formula"][:16_000], map(float, cols["target"][:16_000])))
    assert sorted(zip(data.formulas, data.y)) == shipped               # the same rows, only reordered
    assert [f for f, _ in shipped] != data.formulas[:16_000]
    mean = sum(data.y[i] for i in train) / len(train)
    assert round(evaluation.rmse([data.y[i] for i in test], [mean] * len(test)), 3) == 0.536
    profile = chemdata.target_profile(data.y)
    assert profile["share_positive"] > 0.7 and profile["min"] > -0.2    # mostly unstable compounds
    _raises(ValueError, chemdata.load_mp_formation_energy, head=0, download=False)
    _raises(ValueError, chemdata.load_mp_formation_energy, head=10 ** 6, download=False)
    assert chemdata.target_profile([-1.0, 0.0, 2.0, 3.0]) == {"n": 4, "min": -1.0, "max": 3.0, "mean": 1.0,
                                                              "median": 1.0, "share_positive": 0.5}
    assert chemdata.prediction_spread([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    assert abs(chemdata.prediction_spread([1.0, 2.0, 3.0], [0.0, 2.0, 4.0]) - 2.0) < 1e-12
    _raises(ValueError, chemdata.prediction_spread, [1.0, 1.0], [1.0, 2.0])


def t_load_mp_formation_energy_dedupe():
    deduped = chemdata.load_mp_formation_energy(dedupe=True, download=False)
    assert (len(deduped), deduped.info["n_merged"]) == (95_118, 37_634)
    reduced = [formulas.reduced_formula(f) for f in deduped.formulas[:5000]]
    assert len(set(reduced)) == len(reduced)


def t_load_mp_formation_energy_from_deepchem_json():
    def structure(*species):
        return {"@module": "pymatgen.core.structure", "lattice": {},
                "sites": [{"species": [{"element": e, "occu": o}], "abc": [0, 0, 0]}
                          for e, o in species]}
    records = [{"structure": structure(("Fe", 1), ("Fe", 1), ("O", 1), ("O", 1), ("O", 1)),
                "formation_energy": -1.5},
               {"structure": json.dumps(structure(("Na", 1), ("Cl", 1))), "formation_energy": -2.0}]
    with tempfile.TemporaryDirectory() as folder, _env(CHEMDATA_DIR=folder):
        path = os.path.join(folder, "mp_formation_energy.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in records) + "\n")
        data = chemdata.load_mp_formation_energy(download=False)
    assert sorted(zip(data.formulas, data.y)) == [("Cl1Na1", -2.0), ("Fe2O3", -1.5)]
    assert data.source_file == path


def t_load_uspto50k_and_filters():
    uspto = _uspto()
    assert len(uspto) == 50_037
    assert uspto.info["split_counts"] == {"train": 40_029, "valid": 5_004, "test": 5_004}
    assert uspto.info["class_counts"] == {1: 15122, 2: 11913, 3: 5639, 4: 900, 5: 650,
                                          6: 8353, 7: 4585, 8: 814, 9: 1834, 10: 227}
    assert len(chemdata.filter_reactions(uspto.reactions)) == 50_037   # all single-product
    kept = chemdata.filter_reactions(uspto.reactions, max_len=48)
    assert len(kept) == 24_178
    per_split = [sum(1 for i in kept if uspto.splits[i] == s) for s in ("train", "valid", "test")]
    assert per_split == [19_345, 2_423, 2_410]
    assert chemdata.split_reaction("CC.O>>CCO") == ("CC.O", "CCO")
    for bad in ["CC>O>CCO", "CCO", "A>>B>>C"]:
        _raises(ValueError, chemdata.split_reaction, bad)
    assert chemdata.filter_reactions(["C.C>>CC", "CC>>C.C", "CCCC>>C"], max_len=3) == [0]
    assert chemdata.strip_atom_maps("[CH3:1][OH:12].[Na+]>>[CH3:1]O") == "[CH3][OH].[Na+]>>[CH3]O"


def t_uspto_csv_rebuilds_from_liu_files():
    folder = os.path.join(chemdata.data_dir(), "uspto50k_liu2017_original")
    with tempfile.TemporaryDirectory() as out:
        path = chemdata.build_uspto50k_csv(folder, os.path.join(out, "USPTO_50K.csv"))
        assert chemdata.sha256_of(path) == chemdata.DATA_FILES["USPTO_50K.csv"]["sha256"]


def t_missing_file_offline_gives_clear_error():
    loaders = [(chemdata.load_esol, "delaney-processed.csv"), (chemdata.load_hopv, "hopv.csv"),
               (chemdata.load_mp_formation_energy, "mp_e_form.csv"),
               (chemdata.load_uspto50k, "USPTO_50K.csv")]
    with tempfile.TemporaryDirectory() as folder, _patched(chemdata, "_fetch_url", _no_network):
        for offline_switch in ({"CHEMDATA_OFFLINE": "1"}, {"CHEMDATA_OFFLINE": None}):
            with _env(CHEMDATA_DIR=folder, **offline_switch):
                for loader, name in loaders:
                    kwargs = {} if offline_switch["CHEMDATA_OFFLINE"] else {"download": False}
                    exc = _raises(chemdata.DatasetNotFoundError, loader, **kwargs)
                    assert isinstance(exc, FileNotFoundError)
                    message = str(exc)
                    assert name in message and folder in message, message
                    assert chemdata.DATA_FILES[name]["url"] in message, message
                    assert exc.__cause__ is None and exc.__context__ is None
        assert os.listdir(folder) == []


def t_download_failure_is_clear_and_leaves_no_file():
    def refused(url):
        raise urllib.error.URLError("[Errno 111] Connection refused")

    with tempfile.TemporaryDirectory() as folder, _env(CHEMDATA_DIR=folder, CHEMDATA_OFFLINE=None):
        with _patched(chemdata, "_fetch_url", refused):
            exc = _raises(chemdata.DatasetNotFoundError, chemdata.load_esol)
        assert "Connection refused" in str(exc) and "delaney-processed.csv" in str(exc)
        assert exc.__suppress_context__ and exc.__cause__ is None   # no urllib traceback
        with _patched(chemdata, "_fetch_url", lambda url: b"not the file"):
            exc = _raises(chemdata.ChecksumError, chemdata.load_esol)
        assert chemdata.DATA_FILES["delaney-processed.csv"]["sha256"] in str(exc)
        assert os.listdir(folder) == []


def t_download_verifies_and_writes_atomically():
    local = chemdata.data_dir()

    def read(name):
        with open(os.path.join(local, name), "rb") as f:
            return f.read()

    archive = io.BytesIO()   # DeepChem ships hopv.csv inside hopv.tar.gz
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        content = read("hopv.csv")
        member = tarfile.TarInfo("hopv.csv")
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
    served = {chemdata.DATA_FILES["delaney-processed.csv"]["url"]: read("delaney-processed.csv"),
              chemdata.DATA_FILES["hopv.csv"]["url"]: archive.getvalue()}
    for name in chemdata._liu_files():
        served[chemdata.DATA_FILES[name]["url"]] = read(name)
    requested = []

    def fake_fetch(url):
        requested.append(url)
        return served[url]

    with tempfile.TemporaryDirectory() as folder, _env(CHEMDATA_DIR=folder, CHEMDATA_OFFLINE=None), \
            _patched(chemdata, "_fetch_url", fake_fetch):
        assert len(chemdata.load_esol()) == 1128
        assert len(chemdata.load_hopv()) == 233
        assert len(chemdata.load_uspto50k()) == 50_037   # downloads the Liu files, builds the CSV
        assert len(requested) == 8
        assert len(chemdata.load_esol()) == 1128         # second call: no new download
        assert len(requested) == 8
        report = chemdata.check_data_files()
        assert report["mp_e_form.csv"] == "missing"
        assert all(v == "ok" for k, v in report.items() if k != "mp_e_form.csv" and not k.startswith("moses/"))
        leftovers = [n for n in os.listdir(folder) if n.startswith(".tmp")]
        assert leftovers == []


def t_uspto_builds_offline_from_liu_files():
    source = chemdata.data_dir()
    with tempfile.TemporaryDirectory() as folder, _env(CHEMDATA_DIR=folder, CHEMDATA_OFFLINE="1"), \
            _patched(chemdata, "_fetch_url", _no_network):
        os.mkdir(os.path.join(folder, "uspto50k_liu2017_original"))
        for name in chemdata._liu_files():
            shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))
        assert len(chemdata.load_uspto50k()) == 50_037


# ---------------------------------------------------------------------------
# splits
# ---------------------------------------------------------------------------

def _check_partition(parts, n):
    train, valid, test = parts
    assert sorted(train + valid + test) == list(range(n))


def t_random_split():
    esol = _esol()
    parts = chemdata.random_split(esol.smiles, seed=0)
    _check_partition(parts, 1128)
    assert [len(p) for p in parts] == [902, 113, 113]
    assert parts == chemdata.random_split(esol.smiles, seed=0)
    assert parts != chemdata.random_split(esol.smiles, seed=1)
    by_index = chemdata.random_split(1128, seed=0)
    _check_partition(by_index, 1128)
    assert [len(p) for p in by_index] == [902, 113, 113]
    # ESOL repeats 5 SMILES strings once their trailing spaces are stripped:
    # each pair must land in one split
    repeats = chemdata.duplicate_report(esol.smiles)["groups"]
    assert len(repeats) == 5
    where = {i: k for k, part in enumerate(parts) for i in part}
    assert all(len({where[i] for i in rows}) == 1 for rows in repeats.values())
    hopv = chemdata.load_hopv(download=False)
    assert [len(p) for p in chemdata.random_split(hopv.smiles, seed=0)] == [186, 23, 24]
    # equal items never straddle two splits
    items = ["A"] * 5 + ["B"] * 3 + [str(i) for i in range(12)]
    parts = chemdata.random_split(items, seed=3)
    _check_partition(parts, len(items))
    for part in parts:
        if any(items[i] == "A" for i in part):
            assert sum(items[i] == "A" for i in part) == 5
    _raises(ValueError, chemdata.random_split, 10, fractions=(0.8, 0.1, 0.2))


def t_group_split():
    keys = [f"k{i % 37}" for i in range(500)]
    parts = chemdata.group_split(keys, (0.7, 0.2, 0.1), seed=5)
    _check_partition(parts, 500)
    seen = [{keys[i] for i in part} for part in parts]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert parts == chemdata.group_split(keys, (0.7, 0.2, 0.1), seed=5)
    assert abs(len(parts[0]) - 350) < 20


def t_scaffold_split_esol():
    _need_rdkit()
    esol = _esol()
    parts = _esol_scaffold_split()
    _check_partition(parts, 1128)
    assert [len(p) for p in parts] == [902, 113, 113]
    scaffolds = [{chemdata.murcko_scaffold(esol.smiles[i]) for i in part} for part in parts]
    assert not (scaffolds[0] & scaffolds[1] or scaffolds[0] & scaffolds[2]
                or scaffolds[1] & scaffolds[2])
    assert chemdata.scaffold_split(list(esol.smiles)) == parts   # deterministic
    canonical = [{chemdata.canonical_smiles(esol.smiles[i]) for i in part} for part in parts]
    assert not (canonical[0] & canonical[1] or canonical[0] & canonical[2]
                or canonical[1] & canonical[2])


# ---------------------------------------------------------------------------
# RDKit helpers
# ---------------------------------------------------------------------------

def t_canonical_smiles_and_duplicates():
    _need_rdkit()
    assert chemdata.canonical_smiles("OCC") == chemdata.canonical_smiles("C(O)C") == "CCO"
    assert chemdata.canonical_smiles("C1CC") is None
    report = chemdata.duplicate_report(_esol().smiles, key=chemdata.canonical_smiles)
    assert (report["n_invalid"], report["n_repeats"], len(report["groups"])) == (0, 11, 11)
    plain = chemdata.duplicate_report(["a", "b", "a", "a"])
    assert (plain["n_unique"], plain["n_repeats"], plain["groups"]) == (2, 2, {"a": [0, 2, 3]})


def t_fingerprints_and_tanimoto():
    _need_rdkit()
    assert chemdata.is_valid_smiles("c1ccccc1O")
    assert not chemdata.is_valid_smiles("C1CC") and not chemdata.is_valid_smiles("")
    phenol, toluene, same = chemdata.morgan_fingerprints(["c1ccccc1O", "Cc1ccccc1", "Oc1ccccc1"])
    assert len(phenol) == 1024 and set(phenol) <= {0, 1} and sum(phenol) > 0
    assert phenol == same and chemdata.tanimoto(phenol, same) == 1.0
    assert 0 < chemdata.tanimoto(phenol, toluene) < 1
    assert len(chemdata.morgan_fingerprints(["CCO"], radius=1, n_bits=64)[0]) == 64
    assert "position 1" in str(_raises(ValueError, chemdata.morgan_fingerprints, ["C", "C1CC"]))
    assert chemdata.tanimoto([1, 1, 0, 0], [1, 0, 1, 0]) == 1 / 3
    assert chemdata.tanimoto([0, 0], [0, 0]) == 0.0


# ---------------------------------------------------------------------------
# baselines and metrics
# ---------------------------------------------------------------------------

def _close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(1.0, abs(b))


def t_ridge_against_hand_solutions():
    X, y = [[1.0], [2.0], [3.0]], [2.0, 4.0, 6.0]
    exact = evaluation.ridge_fit(X, y, alpha=0.0)
    assert _close(exact.weights[0], 2.0) and _close(exact.intercept, 0.0, 1e-12)
    # centred x = (-1, 0, 1): w = Sxy / (Sxx + alpha) = 4 / 3, b = 4 - 2 w = 4 / 3
    shrunk = evaluation.ridge_fit(X, y, alpha=1.0)
    assert _close(shrunk.weights[0], 4 / 3) and _close(shrunk.intercept, 4 / 3)
    # no intercept: w = sum(x y) / (sum(x^2) + alpha) = 28 / 15
    assert _close(evaluation.ridge_fit(X, y, alpha=1.0, fit_intercept=False).weights[0], 28 / 15)
    two = evaluation.ridge_fit([[1, 0], [0, 1], [1, 1]], [1, 2, 3], alpha=0.0, fit_intercept=False)
    assert _close(two.weights[0], 1.0) and _close(two.weights[1], 2.0)
    predictions = evaluation.ridge_predict(shrunk, [[0.0], [3.0]])
    assert _close(predictions[0], 4 / 3) and _close(predictions[1], 16 / 3)
    _raises(ValueError, evaluation.ridge_fit, [[1, 1], [2, 2]], [1, 2], alpha=0.0,
            fit_intercept=False)   # singular
    _raises(ValueError, evaluation.ridge_fit, [[1], [2]], [1.0])


def t_ridge_on_element_fractions():
    train = ["Fe2O3", "FeO", "Fe3O4", "NaCl", "KCl", "NaF"]
    y = [-1.7, -1.4, -1.6, -2.1, -2.2, -3.0]
    X = [formulas.element_fractions(f) for f in train]
    model = evaluation.ridge_fit(X, y, alpha=1e-3)
    assert len(model.weights) == 89
    assert evaluation.rmse(y, evaluation.ridge_predict(model, X)) < 0.2


def t_metrics_against_hand_values():
    t, p = [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    assert _close(evaluation.rmse(t, p), math.sqrt(1 / 3))
    assert _close(evaluation.mae(t, p), 1 / 3)
    assert _close(evaluation.r2(t, p), 0.5)
    assert _close(evaluation.pearson(t, p), 9 / math.sqrt(84))
    mean = evaluation.mean_baseline([1.0, 2.0, 3.0, 6.0], 3)
    assert mean == [3.0, 3.0, 3.0]
    assert evaluation.r2([1.0, 3.0, 5.0], mean) == 0.0
    assert evaluation.pearson(t, mean) is None
    _raises(ValueError, evaluation.r2, [2.0, 2.0], [1.0, 3.0])
    _raises(ValueError, evaluation.rmse, [1.0], [1.0, 2.0])
    _raises(ValueError, evaluation.mae, [], [])


def t_paired_bootstrap_identical_offset_and_noise():
    """Identical predictions: difference 0 with the interval [0, 0]; a constant offset c on every item:
    RMSE and MAE differences exactly |c| in every resample; a real gap under noise: an interval that
    excludes 0 and contains the full-set difference."""
    import random
    rng = random.Random(3)
    y = [rng.gauss(0, 1) for _ in range(80)]
    a = [v + rng.gauss(0, 0.5) for v in y]
    same = evaluation.paired_bootstrap(y, a, a, n_resamples=500)
    assert (same["diff"], same["ci_low"], same["ci_high"], same["n_items"]) == (0.0, 0.0, 0.0, 80)
    for metric in ("rmse", "mae"):
        off = evaluation.paired_bootstrap(y, [v - 0.3 for v in y], y, metric=metric, n_resamples=500)
        assert all(_close(off[k], 0.3) for k in ("diff", "ci_low", "ci_high")), off
    worse = evaluation.paired_bootstrap(y, [v + 1.0 for v in a], a, n_resamples=500)
    assert 0 < worse["ci_low"] <= worse["diff"] <= worse["ci_high"], worse
    # seeds pooled: three seeds' predictions over the same 80 items are resampled as 80 items, not 240
    pooled = evaluation.paired_bootstrap(y * 3, a * 3, y * 3, groups=list(range(80)) * 3, n_resamples=200)
    assert pooled["n_items"] == 80 and _close(pooled["diff"], evaluation.rmse(y, a))
    # per-item scores (metric 'mean'): None (an invalid prediction) is left out of the mean
    score = evaluation.paired_bootstrap(None, [1.0, None, 0.5], [0.0, 0.0, 0.0], metric="mean", n_resamples=50)
    assert _close(score["diff"], 0.75)
    _raises(ValueError, evaluation.paired_bootstrap, y, a, a, metric="r2")
    _raises(ValueError, evaluation.paired_bootstrap, y, a, a[:-1])
    _raises(ValueError, evaluation.paired_bootstrap, y, a, a, n_resamples=0)
    _raises(ValueError, evaluation.paired_bootstrap, y * 2, a * 2, a * 2, groups=[0])


def t_paired_bootstrap_statistic_is_the_mean_bootstrap_for_the_mean_and_pairs_items():
    """paired_bootstrap_statistic draws the items as paired_bootstrap does: with the mean as the statistic the
    two give the same difference and interval, None values left out alike; a whole-sample statistic (the KS
    distance to a reference) of the same values on both sides gives [0, 0], and a shift an interval above 0."""
    import random
    import generation_metrics
    rng = random.Random(5)
    a = [rng.gauss(0, 1) if i % 7 else None for i in range(60)]
    b = [rng.gauss(0.2, 1) for _ in range(60)]
    mean = evaluation.paired_bootstrap(None, a, b, metric="mean", n_resamples=300, seed=4)
    got = evaluation.paired_bootstrap_statistic(a, b, lambda xs: sum(xs) / len(xs), n_resamples=300, seed=4)
    assert all(_close(got[k], mean[k]) for k in ("diff", "ci_low", "ci_high")) and got["n_items"] == 60, (got, mean)
    ref = [rng.randint(0, 20) for _ in range(300)]
    heavy = [rng.randint(0, 15) if i % 5 else None for i in range(400)]

    def ks(xs):
        return generation_metrics.ks_statistic(xs, ref)
    same = evaluation.paired_bootstrap_statistic(heavy, heavy, ks, n_resamples=100)
    assert (same["diff"], same["ci_low"], same["ci_high"]) == (0.0, 0.0, 0.0)
    shifted = evaluation.paired_bootstrap_statistic(heavy, [None if x is None else x + 5 for x in heavy], ks,
                                                    n_resamples=100)
    assert shifted["ci_low"] > 0 and _close(shifted["diff"], ks([x for x in heavy if x is not None])
                                            - ks([x + 5 for x in heavy if x is not None])), shifted
    _raises(ValueError, evaluation.paired_bootstrap_statistic, a, b[:-1], ks)
    _raises(ValueError, evaluation.paired_bootstrap_statistic, [None], [1.0], ks)


def t_zscore():
    scaler = evaluation.ZScore().fit([1.0, 3.0])
    assert (scaler.mean, scaler.std) == (2.0, 1.0)
    assert scaler.transform([2.0, 4.0]) == [0.0, 2.0]
    values = [-3.2, 0.5, 7.25]
    scaler = evaluation.ZScore().fit(values)
    assert all(_close(a, b) for a, b in zip(scaler.inverse(scaler.transform(values)), values))
    _raises(ValueError, evaluation.ZScore().fit, [4.0, 4.0])
    _raises(ValueError, evaluation.ZScore().transform, [1.0])


# ---------------------------------------------------------------------------
# DeepChem agreement
# ---------------------------------------------------------------------------

def t_deepchem_agrees_on_esol():
    _need_rdkit()
    dc = _need_deepchem()
    import numpy as np
    esol = _esol()
    with tempfile.TemporaryDirectory() as save_dir:
        tasks, (dataset,), _ = dc.molnet.load_delaney(
            featurizer=dc.feat.DummyFeaturizer(), splitter=None, transformers=[],
            data_dir=chemdata.data_dir(), save_dir=save_dir)
        assert tasks == [chemdata.ESOL_TASK]
        assert [s.strip() for s in dataset.ids] == esol.smiles
        assert np.allclose(dataset.y[:, 0], esol.y)
        splits = dc.splits.ScaffoldSplitter().split(dataset)
    assert [list(s) for s in splits] == list(_esol_scaffold_split())



def t_command_line_check_reports_the_data_folder():
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert chemdata.main(["check"]) == 0
    assert "delaney-processed.csv" in out.getvalue() and "missing" not in out.getvalue()
    with tempfile.TemporaryDirectory() as empty, _env(CHEMDATA_DIR=empty):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert chemdata.main(["check"]) == 1
        assert out.getvalue().count("missing") == len(chemdata.DATA_FILES)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert _raises(SystemExit, chemdata.main, ["frobnicate"]).code == 2
    assert "invalid choice: 'frobnicate'" in err.getvalue()


def t_command_line_help_and_usage_errors():
    """``--help`` (also after a subcommand) prints usage on stdout and exits 0; an unknown or missing command
    and stray arguments are usage errors: exit status 2, message on stderr."""
    for argv, words in ([["--help"], ("fetch", "check", "chem-transformer-predict")],
                        [["check", "--help"], ("sha256",)]):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert _raises(SystemExit, chemdata.main, argv).code == 0
        assert out.getvalue().startswith("usage: python chemdata.py") and all(w in out.getvalue() for w in words)
    for argv in ([], ["bogus"], ["check", "extra"], ["fetch", "predict"], ["--help-predict"]):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            assert _raises(SystemExit, chemdata.main, argv).code == 2, argv
        assert "usage: python chemdata.py" in err.getvalue() and "error:" in err.getvalue(), argv
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "chemdata.py")
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: python chemdata.py" in proc.stdout and not proc.stderr
    proc = subprocess.run([sys.executable, script, "bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and not proc.stdout

# ---------------------------------------------------------------------------
# experiment 9: reaction product prediction helpers
# ---------------------------------------------------------------------------

def t_reaction_canonical_match_counts_a_reordered_product():
    _need_rdkit()
    assert reactions.canonical_match("OCC", "CCO") and reactions.canonical_match("c1ccccc1C", "Cc1ccccc1")
    assert reactions.canonical_match("C(=O)(O)C", "CC(=O)O")
    assert not reactions.canonical_match("CCN", "CCO")
    assert not reactions.canonical_match("C[C@H](N)O", "C[C@@H](N)O")        # stereo counts
    for bad in ["", "C1CC", "((", None]:
        assert not reactions.canonical_match(bad, "CCO")
    assert "'C1CC'" in str(_raises(ValueError, reactions.canonical_match, "CCO", "C1CC"))
    aspirin = "CC(=O)Oc1ccccc1C(=O)O"
    spellings = {reactions.random_spelling(aspirin, seed=s) for s in range(5)}
    assert reactions.random_spelling(aspirin, seed=1) == reactions.random_spelling(aspirin, seed=1)
    assert len(spellings) > 1 and all(reactions.canonical_match(s, aspirin) for s in spellings)
    _raises(ValueError, reactions.random_spelling, "C1CC")


def t_reaction_heavy_atoms_and_conservation():
    _need_rdkit()
    assert reactions.heavy_atom_counts("CC(=O)O") == {"C": 2, "O": 2}
    assert reactions.heavy_atom_counts("[2H]C.[Na+].[Cl-]") == {"C": 1, "Na": 1, "Cl": 1}
    assert reactions.heavy_atom_counts("C1CC") is None and reactions.heavy_atom_counts("") is None
    assert reactions.atoms_conserved("CCOC(C)=O", "CCO.CC(=O)O")              # ester from acid + alcohol
    assert reactions.atoms_conserved("CCO", "OCC")
    assert not reactions.atoms_conserved("CCCl", "CCO")                        # Cl from nowhere
    assert not reactions.atoms_conserved("CCOCC", "CCO")                        # two ethyls from one
    assert not reactions.atoms_conserved("C1CC", "CCO") and not reactions.atoms_conserved("", "CCO")
    assert "'C1CC'" in str(_raises(ValueError, reactions.atoms_conserved, "CCO", "C1CC"))


def t_reaction_copy_largest_reactant():
    _need_rdkit()
    assert reactions.copy_largest_reactant("CCO.c1ccccc1C(=O)Cl") == ["c1ccccc1C(=O)Cl"]
    assert reactions.copy_largest_reactant("CCO.c1ccccc1C(=O)Cl", k=5) == ["c1ccccc1C(=O)Cl", "CCO"]
    assert reactions.copy_largest_reactant("OC.CO.CCC") == ["CCC"]              # ties keep input order
    assert reactions.reactants_by_size("C1CC.O.CC") == ["CC", "O", "C1CC"]      # unparsable last
    # [2H] is not a heavy atom: CO has 2 heavy atoms, [2H]C([2H])([2H])Cl has 2 as well -> input order
    assert reactions.copy_largest_reactant("CO.[2H]C([2H])([2H])Cl") == ["CO"]


def t_reaction_nearest_training_baseline():
    _need_rdkit()
    reactants = ["CCO.CC(=O)O", "c1ccccc1Br.OB(O)c1ccccc1", "C1CC", "CCN.CC(=O)Cl", "CCO.CC(=O)O"]
    products = ["CCOC(C)=O", "c1ccc(-c2ccccc2)cc1", "CC", "CCNC(C)=O", "O=C(C)OCC"]
    nb = reactions.NearestReactionBaseline(reactants, products)
    assert nb.n_skipped == 1 and nb.skipped == [2]
    assert nb.predict("OCC.OC(C)=O") == ["CCOC(C)=O"]                         # same molecules, other spelling
    ranked = nb.predict("OCC.OC(C)=O", k=5)
    assert ranked[0] == "CCOC(C)=O" and "O=C(C)OCC" not in ranked              # duplicate product skipped
    assert len(ranked) == 3 and ranked[-1] == "c1ccc(-c2ccccc2)cc1"         # nothing in common: last
    sims = nb.similarities("Brc1ccccc1.OB(O)c1ccccc1")
    assert sims[1] == 1.0 and max(sims) == 1.0 and len(sims) == 4
    assert "'C1CC'" in str(_raises(ValueError, nb.predict, "C1CC"))
    _raises(ValueError, reactions.NearestReactionBaseline, ["CCO"], [])
    _raises(ValueError, reactions.NearestReactionBaseline, ["C1CC"], ["CC"])


def t_reaction_score_prediction():
    _need_rdkit()
    truth, reactants = "CCOC(C)=O", "CCO.CC(=O)O"
    s = reactions.score_prediction(["CCO", "O=C(C)OCC", "CCOC(C)=O"], truth, reactants)
    assert s["rank"] == 2 and s["valid"] and s["conserved"] and 0 < s["tanimoto"] < 1
    s = reactions.score_prediction(["C1CC", "CCN"], truth, reactants)
    assert s == {"rank": None, "valid": False, "tanimoto": 0.0, "conserved": False}
    assert reactions.score_prediction([], truth, reactants)["valid"] is False
    assert reactions.score_prediction([truth], truth, reactants)["tanimoto"] == 1.0
    assert reactions.product_tanimoto("CCO", "OCC") == 1.0 and reactions.product_tanimoto("", "CCO") == 0.0


def t_reaction_true_products_mostly_conserve_atoms():
    _need_rdkit()
    uspto = _uspto()
    kept = chemdata.filter_reactions(uspto.reactions, max_len=48)[:2000]
    pairs = [chemdata.split_reaction(uspto.reactions[i]) for i in kept]
    ok = sum(reactions.atoms_conserved(p, r) for r, p in pairs)
    assert ok >= 0.98 * len(pairs), ok                 # the rest are salts (a counter-ion as "product")


def t_formula_reordering_keeps_the_composition():
    import random
    assert property_features.formula_reordered("Ca1F6Ti1", [2, 0, 1]) == "Ti1Ca1F6"
    _raises(ValueError, property_features.formula_reordered, "Ca1F6Ti1", [0, 0, 1])
    _raises(ValueError, property_features.formula_reordered, "Ca3(PO4)2", [0, 1, 2])
    assert property_features.formula_orders("Fe2", 3, random.Random(0)) == []
    assert property_features.formula_orders("Fe2O3", 3, random.Random(0)) == ["O3Fe2"]
    others = property_features.formula_orders("Ca1F6O3Ti1", 5, random.Random(1))
    assert len(set(others)) == 5 and "Ca1F6O3Ti1" not in others
    assert all(formulas.reduced_formula(f) == formulas.reduced_formula("Ca1F6O3Ti1") for f in others)


def t_molecule_helpers():
    import random
    _need_rdkit()
    variants = property_features.randomized_smiles("OCc1ccccc1Cl", 6, random.Random(0))
    assert len(variants) == 6 and len(set(variants)) > 1
    assert {chemdata.canonical_smiles(v) for v in variants} == {chemdata.canonical_smiles("OCc1ccccc1Cl")}
    assert variants == property_features.randomized_smiles("OCc1ccccc1Cl", 6, random.Random(0))
    logp, mw, rot, arom = property_features.esol_descriptors("c1ccccc1O")
    assert abs(mw - 94.113) < 0.01 and rot == 0 and abs(arom - 6 / 7) < 1e-12
    fr = property_features.molecule_element_fractions("CCO")
    assert abs(fr[formulas.FRACTION_ELEMENTS.index("H")] - 6 / 9) < 1e-12 and abs(sum(fr) - 1) < 1e-12
    _raises(ValueError, property_features.esol_descriptors, "C1CC")


def t_element_features_periodic_table():
    """Period and group from the atomic number (f-block in group 3), RDKit's values, z-scored columns."""
    _need_rdkit()
    expect = {"H": (1, 1), "He": (1, 18), "B": (2, 13), "Na": (3, 1), "Zn": (4, 12), "Kr": (4, 18), "La": (6, 3),
              "Hf": (6, 4), "Au": (6, 11), "U": (7, 3)}
    raw = property_features.element_features(list(expect), standardize=False)
    names = property_features.ELEMENT_FEATURE_NAMES
    for sym, (period, group) in expect.items():
        f = dict(zip(names, raw[sym]))
        assert (f["period"], f["group"]) == (period, group), sym
        assert f["f_block"] == (1.0 if sym in ("La", "U") else 0.0)
    assert dict(zip(names, raw["Au"]))["atomic_number"] == 79.0
    z = property_features.element_features(list(expect))
    for col in zip(*z.values()):
        assert abs(sum(col)) < 1e-9
    vocab = chemdata.Vocab.build([formulas.tokenize_formula("Mg2Si1")])
    rows = property_features.token_feature_matrix(vocab, property_features.element_features(["Mg", "Si"]))
    assert len(rows) == len(vocab) and rows[vocab.stoi["2"]] == [0.0] * len(names)
    try:
        property_features.element_features(["Xx"])
    except ValueError as e:
        assert "Xx" in str(e)
    else:
        raise AssertionError("an unknown symbol must raise")



if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))


# ---------------------------------------------------------------------------
# MOSES (moses_data): the reader's one error, nested subsets, vocabularies
# ---------------------------------------------------------------------------

def _moses_gz(path, rows, header="SMILES"):
    import gzip
    with gzip.open(path, "wt", encoding="ascii") as f:
        f.write(header + "\n" + "".join(r + "\n" for r in rows))


def t_moses_truncated_or_corrupt_file_is_one_named_error():
    import moses_data
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "train.csv.gz")
        _moses_gz(good, ["CCO", "c1ccccc1"] * 5000)
        assert moses_data.read_smiles(good)[:2] == ["CCO", "c1ccccc1"]
        with open(good, "rb") as f:
            data = f.read()
        cut = os.path.join(d, "cut.csv.gz")
        with open(cut, "wb") as f:
            f.write(data[:len(data) // 2])
        not_gz = os.path.join(d, "plain.csv.gz")
        with open(not_gz, "w") as f:
            f.write("SMILES\nCCO\n")
        wrong = os.path.join(d, "wrong.csv.gz")
        _moses_gz(wrong, ["CCO"], header="smiles,SPLIT")
        for path in (cut, not_gz, wrong):
            exc = _raises(moses_data.MosesFileError, moses_data.read_smiles, path)
            assert isinstance(exc, chemdata.DatasetFormatError) and exc.path == path and path in str(exc)
            assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


def t_moses_subsets_are_nested_disjoint_and_fixed():
    import moses_data
    train = [f"C{i}" for i in range(moses_data.SIZES[-1] + moses_data.N_VALID + 500)]
    test = [f"N{i}" for i in range(moses_data.N_TEST + 300)]
    a = moses_data.nested_subsets(train, test)
    b = moses_data.nested_subsets(train, test, sizes=(1000, 10000))
    sizes = sorted(a["train"])
    for small, big in zip(sizes, sizes[1:]):
        assert a["train"][big][:small] == a["train"][small]          # nested: each subset starts the next one
    assert not set(a["valid"]) & set(a["train"][sizes[-1]]) and len(a["valid"]) == moses_data.N_VALID
    assert b["valid"] == a["valid"] and b["test"] == a["test"] and b["train"][1000] == a["train"][1000]
    assert len(set(a["test"])) == moses_data.N_TEST and set(a["test"]) <= set(test)
    assert a["train"][1000] != train[:1000]                           # shuffled, not the file's order
    _raises(ValueError, moses_data.nested_subsets, train[:5000], test)


def t_moses_vocabulary_counts_unknown_test_tokens():
    import moses_data
    vocab = moses_data.size_vocab([["C", "C", "O"], ["C", "N"]])
    rec = moses_data.vocab_record(vocab, [["C", "Cl"], ["Br", "O", "Cl"]])
    assert rec["size"] == 4 + 3 and rec["test_unknown_tokens"] == 3 and rec["test_tokens"] == 5
    assert rec["test_molecules_with_unknown"] == 2 and rec["test_symbols_unseen"] == ["Br", "Cl"]
    assert vocab.encode(["Cl"], add_bos_eos=False) == [vocab.unk_id]
