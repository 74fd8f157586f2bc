"""Tests of chemdata.py: tokenizers, vocabularies, loaders, splits, featurizers, metrics.

Run with ``python -m pytest tests_chemdata.py`` or ``python tests_chemdata.py``.
The data files must be in the data folder (``data/`` or ``$CHEMDATA_DIR``);
the tests never download anything.  Tests that need RDKit or DeepChem skip
when those packages are missing (``pip install -e ".[chem]"``).
"""

import ast
import contextlib
import csv
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
        import deepchem  # noqa: F401
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
                 "reactions")


def _modules():
    """chemdata and its topic modules, imported."""
    return [chemdata] + [importlib.import_module(name) for name in TOPIC_MODULES]


def t_module_level_imports_are_standard_library():
    """chemdata and the topic modules import only the standard library and the project's own modules at
    module level; importing them loads no numpy, RDKit, DeepChem or torch."""
    allowed = set(sys.stdlib_module_names) | {"transformer", "safe_io", "chemdata"} | set(TOPIC_MODULES)
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


def t_chemdata_reexports_the_topic_modules_lazily():
    """chemdata's re-export table is each topic module's ``__all__``; ``chemdata.NAME`` is the topic module's
    own object, ``dir(chemdata)`` and ``chemdata.__all__`` list it, an unknown name is an AttributeError naming
    it, and ``from chemdata import NAME`` works whichever module a fresh interpreter imports first."""
    assert tuple(chemdata._TOPIC_NAMES) == TOPIC_MODULES
    listing = set(dir(chemdata))
    for name in TOPIC_MODULES:
        module = importlib.import_module(name)
        assert list(chemdata._TOPIC_NAMES[name]) == module.__all__, name
        for attr in module.__all__:
            assert getattr(chemdata, attr) is getattr(module, attr), attr
            assert attr in chemdata.__all__ and attr in listing, attr
    for attr, name in chemdata._TOPIC_PRIVATE.items():
        assert getattr(chemdata, attr) is getattr(importlib.import_module(name), attr), attr
    assert "'no_such_name'" in str(_raises(AttributeError, getattr, chemdata, "no_such_name"))
    here = os.path.dirname(os.path.abspath(chemdata.__file__))
    for first in TOPIC_MODULES + ("chemdata",):
        code = (f"import {first}, chemdata, smiles_grammar, predictor; "
                "from chemdata import SmilesConstraint, load_predictor, DatasetFormatError; "
                "assert SmilesConstraint is smiles_grammar.SmilesConstraint; "
                "assert load_predictor is predictor.load_predictor; "
                "assert predictor.DatasetFormatError is DatasetFormatError; print('ok')")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (first, out.stderr)


def t_every_chemdata_name_the_project_uses_resolves():
    """Every ``chemdata.X`` / ``cd.X`` in the project's Python files and notebooks resolves (re-exports
    included), so moving a name into a topic module breaks no caller."""
    root = os.path.dirname(os.path.abspath(chemdata.__file__))
    pattern = re.compile(r"\b(?:cd|chemdata)\.([A-Za-z_]\w*)")
    used = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("data", "__pycache__", "node_modules")]
        for name in files:
            if name.endswith((".py", ".ipynb")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for attr in pattern.findall(f.read()):
                        used.setdefault(attr, os.path.relpath(path, root))
    assert "load_esol" in used and "SmilesConstraint" in used, sorted(used)
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
    assert chemdata.tokenize_formula("Mg2Si") == ["Mg", "2", "Si"]
    assert chemdata.tokenize_formula("Fe0.5Ni0.5") == ["Fe", "0.5", "Ni", "0.5"]
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
        assert chemdata.parse_formula(formula) == composition, formula
    assert chemdata.reduced_formula("Ca2F12Ti2") == "CaF6Ti"
    assert chemdata.reduced_formula("Fe0.5Ni0.5") == "FeNi"
    assert chemdata.reduced_formula("O3Fe2") == "Fe2O3"
    assert chemdata.reduced_formula("Fe0.25Ni0.5O2") == "FeNi2O8"
    for bad in ["Xx2", "Fe(", "Fe)", "(Fe]", "2Fe", "Fe0", "Fe-2", "", "Na Cl", "fe"]:
        _raises(ValueError, chemdata.parse_formula, bad)
    assert "Xx" in str(_raises(ValueError, chemdata.tokenize_formula, "Xx2"))


def t_element_fractions():
    assert len(chemdata.ELEMENTS) == 118 and chemdata.ELEMENTS[82] == "Bi"
    assert len(chemdata.FRACTION_ELEMENTS) == 89
    for formula in ["Mg2Si", "Cu3Sn4U3", "Fe0.5Ni0.5", "Ca3(PO4)2", "Pu1O2"]:
        vector = chemdata.element_fractions(formula)
        assert len(vector) == 89 and abs(sum(vector) - 1) < 1e-12, formula
    vector = chemdata.element_fractions("Fe2O3")
    assert vector[chemdata.FRACTION_ELEMENTS.index("Fe")] == 0.4
    assert vector[chemdata.FRACTION_ELEMENTS.index("O")] == 0.6
    assert chemdata.element_fractions("H2O", elements=["O", "H"]) == [1 / 3, 2 / 3]
    assert "Am" in str(_raises(ValueError, chemdata.element_fractions, "Am1O2"))


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
    elements = {e for f in set(mp.formulas) for e in chemdata.parse_formula(f)}
    assert len(elements) == 84 and elements <= set(chemdata.FRACTION_ELEMENTS)
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
    assert round(chemdata.rmse([data.y[i] for i in test], [mean] * len(test)), 3) == 0.536
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
    reduced = [chemdata.reduced_formula(f) for f in deduped.formulas[:5000]]
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
        assert all(v == "ok" for k, v in report.items() if k != "mp_e_form.csv")
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
    exact = chemdata.ridge_fit(X, y, alpha=0.0)
    assert _close(exact.weights[0], 2.0) and _close(exact.intercept, 0.0, 1e-12)
    # centred x = (-1, 0, 1): w = Sxy / (Sxx + alpha) = 4 / 3, b = 4 - 2 w = 4 / 3
    shrunk = chemdata.ridge_fit(X, y, alpha=1.0)
    assert _close(shrunk.weights[0], 4 / 3) and _close(shrunk.intercept, 4 / 3)
    # no intercept: w = sum(x y) / (sum(x^2) + alpha) = 28 / 15
    assert _close(chemdata.ridge_fit(X, y, alpha=1.0, fit_intercept=False).weights[0], 28 / 15)
    two = chemdata.ridge_fit([[1, 0], [0, 1], [1, 1]], [1, 2, 3], alpha=0.0, fit_intercept=False)
    assert _close(two.weights[0], 1.0) and _close(two.weights[1], 2.0)
    predictions = chemdata.ridge_predict(shrunk, [[0.0], [3.0]])
    assert _close(predictions[0], 4 / 3) and _close(predictions[1], 16 / 3)
    _raises(ValueError, chemdata.ridge_fit, [[1, 1], [2, 2]], [1, 2], alpha=0.0,
            fit_intercept=False)   # singular
    _raises(ValueError, chemdata.ridge_fit, [[1], [2]], [1.0])


def t_ridge_on_element_fractions():
    train = ["Fe2O3", "FeO", "Fe3O4", "NaCl", "KCl", "NaF"]
    y = [-1.7, -1.4, -1.6, -2.1, -2.2, -3.0]
    X = [chemdata.element_fractions(f) for f in train]
    model = chemdata.ridge_fit(X, y, alpha=1e-3)
    assert len(model.weights) == 89
    assert chemdata.rmse(y, chemdata.ridge_predict(model, X)) < 0.2


def t_metrics_against_hand_values():
    t, p = [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    assert _close(chemdata.rmse(t, p), math.sqrt(1 / 3))
    assert _close(chemdata.mae(t, p), 1 / 3)
    assert _close(chemdata.r2(t, p), 0.5)
    assert _close(chemdata.pearson(t, p), 9 / math.sqrt(84))
    mean = chemdata.mean_baseline([1.0, 2.0, 3.0, 6.0], 3)
    assert mean == [3.0, 3.0, 3.0]
    assert chemdata.r2([1.0, 3.0, 5.0], mean) == 0.0
    assert chemdata.pearson(t, mean) is None
    _raises(ValueError, chemdata.r2, [2.0, 2.0], [1.0, 3.0])
    _raises(ValueError, chemdata.rmse, [1.0], [1.0, 2.0])
    _raises(ValueError, chemdata.mae, [], [])


def t_paired_bootstrap_identical_offset_and_noise():
    """Identical predictions: difference 0 with the interval [0, 0]; a constant offset c on every item:
    RMSE and MAE differences exactly |c| in every resample; a real gap under noise: an interval that
    excludes 0 and contains the full-set difference."""
    import random
    rng = random.Random(3)
    y = [rng.gauss(0, 1) for _ in range(80)]
    a = [v + rng.gauss(0, 0.5) for v in y]
    same = chemdata.paired_bootstrap(y, a, a, n_resamples=500)
    assert (same["diff"], same["ci_low"], same["ci_high"], same["n_items"]) == (0.0, 0.0, 0.0, 80)
    for metric in ("rmse", "mae"):
        off = chemdata.paired_bootstrap(y, [v - 0.3 for v in y], y, metric=metric, n_resamples=500)
        assert all(_close(off[k], 0.3) for k in ("diff", "ci_low", "ci_high")), off
    worse = chemdata.paired_bootstrap(y, [v + 1.0 for v in a], a, n_resamples=500)
    assert 0 < worse["ci_low"] <= worse["diff"] <= worse["ci_high"], worse
    # seeds pooled: three seeds' predictions over the same 80 items are resampled as 80 items, not 240
    pooled = chemdata.paired_bootstrap(y * 3, a * 3, y * 3, groups=list(range(80)) * 3, n_resamples=200)
    assert pooled["n_items"] == 80 and _close(pooled["diff"], chemdata.rmse(y, a))
    # per-item scores (metric 'mean'): None (an invalid prediction) is left out of the mean
    score = chemdata.paired_bootstrap(None, [1.0, None, 0.5], [0.0, 0.0, 0.0], metric="mean", n_resamples=50)
    assert _close(score["diff"], 0.75)
    _raises(ValueError, chemdata.paired_bootstrap, y, a, a, metric="r2")
    _raises(ValueError, chemdata.paired_bootstrap, y, a, a[:-1])
    _raises(ValueError, chemdata.paired_bootstrap, y, a, a, n_resamples=0)
    _raises(ValueError, chemdata.paired_bootstrap, y * 2, a * 2, a * 2, groups=[0])


def t_zscore():
    scaler = chemdata.ZScore().fit([1.0, 3.0])
    assert (scaler.mean, scaler.std) == (2.0, 1.0)
    assert scaler.transform([2.0, 4.0]) == [0.0, 2.0]
    values = [-3.2, 0.5, 7.25]
    scaler = chemdata.ZScore().fit(values)
    assert all(_close(a, b) for a, b in zip(scaler.inverse(scaler.transform(values)), values))
    _raises(ValueError, chemdata.ZScore().fit, [4.0, 4.0])
    _raises(ValueError, chemdata.ZScore().transform, [1.0])


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
    for argv, words in ([["--help"], ("fetch", "check", "predict")], [["check", "--help"], ("sha256",)],
                        [["predict", "--help"], ("--csv", "--column", "--out", "model")]):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert _raises(SystemExit, chemdata.main, argv).code == 0
        assert out.getvalue().startswith("usage: python chemdata.py") and all(w in out.getvalue() for w in words)
    for argv in ([], ["bogus"], ["check", "extra"], ["predict"], ["predict", "model.json"]):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            assert _raises(SystemExit, chemdata.main, argv).code == 2, argv
        assert "usage: python chemdata.py" in err.getvalue() and "error:" in err.getvalue(), argv
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chemdata.py")
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: python chemdata.py" in proc.stdout and not proc.stderr
    proc = subprocess.run([sys.executable, script, "bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and not proc.stdout

# ---------------------------------------------------------------------------
# experiment 9: reaction product prediction helpers
# ---------------------------------------------------------------------------

def t_reaction_canonical_match_counts_a_reordered_product():
    _need_rdkit()
    assert chemdata.canonical_match("OCC", "CCO") and chemdata.canonical_match("c1ccccc1C", "Cc1ccccc1")
    assert chemdata.canonical_match("C(=O)(O)C", "CC(=O)O")
    assert not chemdata.canonical_match("CCN", "CCO")
    assert not chemdata.canonical_match("C[C@H](N)O", "C[C@@H](N)O")        # stereo counts
    for bad in ["", "C1CC", "((", None]:
        assert not chemdata.canonical_match(bad, "CCO")
    assert "'C1CC'" in str(_raises(ValueError, chemdata.canonical_match, "CCO", "C1CC"))
    aspirin = "CC(=O)Oc1ccccc1C(=O)O"
    spellings = {chemdata.random_spelling(aspirin, seed=s) for s in range(5)}
    assert chemdata.random_spelling(aspirin, seed=1) == chemdata.random_spelling(aspirin, seed=1)
    assert len(spellings) > 1 and all(chemdata.canonical_match(s, aspirin) for s in spellings)
    _raises(ValueError, chemdata.random_spelling, "C1CC")


def t_reaction_heavy_atoms_and_conservation():
    _need_rdkit()
    assert chemdata.heavy_atom_counts("CC(=O)O") == {"C": 2, "O": 2}
    assert chemdata.heavy_atom_counts("[2H]C.[Na+].[Cl-]") == {"C": 1, "Na": 1, "Cl": 1}
    assert chemdata.heavy_atom_counts("C1CC") is None and chemdata.heavy_atom_counts("") is None
    assert chemdata.atoms_conserved("CCOC(C)=O", "CCO.CC(=O)O")              # ester from acid + alcohol
    assert chemdata.atoms_conserved("CCO", "OCC")
    assert not chemdata.atoms_conserved("CCCl", "CCO")                        # Cl from nowhere
    assert not chemdata.atoms_conserved("CCOCC", "CCO")                        # two ethyls from one
    assert not chemdata.atoms_conserved("C1CC", "CCO") and not chemdata.atoms_conserved("", "CCO")
    assert "'C1CC'" in str(_raises(ValueError, chemdata.atoms_conserved, "CCO", "C1CC"))


def t_reaction_copy_largest_reactant():
    _need_rdkit()
    assert chemdata.copy_largest_reactant("CCO.c1ccccc1C(=O)Cl") == ["c1ccccc1C(=O)Cl"]
    assert chemdata.copy_largest_reactant("CCO.c1ccccc1C(=O)Cl", k=5) == ["c1ccccc1C(=O)Cl", "CCO"]
    assert chemdata.copy_largest_reactant("OC.CO.CCC") == ["CCC"]              # ties keep input order
    assert chemdata.reactants_by_size("C1CC.O.CC") == ["CC", "O", "C1CC"]      # unparsable last
    # [2H] is not a heavy atom: CO has 2 heavy atoms, [2H]C([2H])([2H])Cl has 2 as well -> input order
    assert chemdata.copy_largest_reactant("CO.[2H]C([2H])([2H])Cl") == ["CO"]


def t_reaction_nearest_training_baseline():
    _need_rdkit()
    reactants = ["CCO.CC(=O)O", "c1ccccc1Br.OB(O)c1ccccc1", "C1CC", "CCN.CC(=O)Cl", "CCO.CC(=O)O"]
    products = ["CCOC(C)=O", "c1ccc(-c2ccccc2)cc1", "CC", "CCNC(C)=O", "O=C(C)OCC"]
    nb = chemdata.NearestReactionBaseline(reactants, products)
    assert nb.n_skipped == 1 and nb.skipped == [2]
    assert nb.predict("OCC.OC(C)=O") == ["CCOC(C)=O"]                         # same molecules, other spelling
    ranked = nb.predict("OCC.OC(C)=O", k=5)
    assert ranked[0] == "CCOC(C)=O" and "O=C(C)OCC" not in ranked              # duplicate product skipped
    assert len(ranked) == 3 and ranked[-1] == "c1ccc(-c2ccccc2)cc1"         # nothing in common: last
    sims = nb.similarities("Brc1ccccc1.OB(O)c1ccccc1")
    assert sims[1] == 1.0 and max(sims) == 1.0 and len(sims) == 4
    assert "'C1CC'" in str(_raises(ValueError, nb.predict, "C1CC"))
    _raises(ValueError, chemdata.NearestReactionBaseline, ["CCO"], [])
    _raises(ValueError, chemdata.NearestReactionBaseline, ["C1CC"], ["CC"])


def t_reaction_score_prediction():
    _need_rdkit()
    truth, reactants = "CCOC(C)=O", "CCO.CC(=O)O"
    s = chemdata.score_prediction(["CCO", "O=C(C)OCC", "CCOC(C)=O"], truth, reactants)
    assert s["rank"] == 2 and s["valid"] and s["conserved"] and 0 < s["tanimoto"] < 1
    s = chemdata.score_prediction(["C1CC", "CCN"], truth, reactants)
    assert s == {"rank": None, "valid": False, "tanimoto": 0.0, "conserved": False}
    assert chemdata.score_prediction([], truth, reactants)["valid"] is False
    assert chemdata.score_prediction([truth], truth, reactants)["tanimoto"] == 1.0
    assert chemdata.product_tanimoto("CCO", "OCC") == 1.0 and chemdata.product_tanimoto("", "CCO") == 0.0


def t_reaction_true_products_mostly_conserve_atoms():
    _need_rdkit()
    uspto = _uspto()
    kept = chemdata.filter_reactions(uspto.reactions, max_len=48)[:2000]
    pairs = [chemdata.split_reaction(uspto.reactions[i]) for i in kept]
    ok = sum(chemdata.atoms_conserved(p, r) for r, p in pairs)
    assert ok >= 0.98 * len(pairs), ok                 # the rest are salts (a counter-ion as "product")


# ---------------------------------------------------------------------------
# experiments 4-5: SMILES constraint, failure reasons, SELFIES
# ---------------------------------------------------------------------------

def _smiles_vocabs():
    """(vocab of every ESOL token, the 28-id training vocabulary of experiment 4)."""
    esol = _esol()
    tokens = [chemdata.tokenize_smiles(s) for s in esol.smiles]
    full = chemdata.Vocab.build(tokens)
    train_idx = _esol_scaffold_split()[0]
    counts = chemdata.Counter(t for i in train_idx for t in tokens[i])
    top = sorted(counts, key=lambda t: (-counts[t], t))[:24]
    return full, chemdata.Vocab(top), tokens


def _walk(constraint, vocab, choose, max_tokens=60):
    """One constrained walk: choose(allowed_sorted) picks each next id; returns (ids, ended_with_eos).
    A dead end (nothing allowed: generate's "no_allowed_token") ends the walk unfinished."""
    ids = [vocab.bos_id]
    for _ in range(max_tokens):
        allowed = sorted(constraint(ids))
        if not allowed:
            return ids, False
        nxt = choose(allowed)
        if nxt == vocab.eos_id:
            return ids, True
        ids.append(nxt)
    return ids, False


def _grammar_ok(tokens, finished):
    """Branches never close more than they opened; a finished molecule has every branch and ring closed."""
    depth, rings = 0, chemdata.Counter()
    for t in tokens:
        depth += (t == "(") - (t == ")")
        assert depth >= 0, tokens
        if chemdata._token_class(t)[0] == "ring":
            rings[t] += 1
    if finished:
        assert depth == 0 and all(n % 2 == 0 for n in rings.values()), tokens
    assert "<unk>" not in tokens


@slow
def t_smiles_constraint_accepts_every_esol_prefix():
    _need_rdkit()
    full, small, tokens = _smiles_vocabs()
    c_full, c_small = chemdata.SmilesConstraint(full), chemdata.SmilesConstraint(small)
    for tk in tokens:
        assert c_full.check(full.encode(tk))              # every prefix, then <eos>
        if all(t in small for t in tk):
            assert c_small.check(small.encode(tk))


@slow
def t_smiles_constraint_random_walks_never_unbalanced():
    _need_rdkit()
    full, small, _ = _smiles_vocabs()
    for vocab in (small, full):
        c = chemdata.SmilesConstraint(vocab)
        rng = chemdata.random.Random(0)
        n_finished = n_parsed = 0
        for _ in range(500):
            ids, finished = _walk(c, vocab, rng.choice)
            tokens = vocab.decode(ids)
            _grammar_ok(tokens, finished)
            if finished:
                n_finished += 1
                reason = chemdata.smiles_failure_reason("".join(tokens))
                assert reason not in ("unbalanced_branch", "unclosed_ring", "unk", "valence"), (reason, tokens)
                n_parsed += reason is None
        assert n_finished > 100 and n_parsed > 0.3 * n_finished, (n_finished, n_parsed)


@slow
def t_smiles_constraint_token_budget():
    _need_rdkit()
    _, small, _ = _smiles_vocabs()
    for budget in (12, 30):
        c = chemdata.SmilesConstraint(small, max_new_tokens=budget)
        rng = chemdata.random.Random(budget)
        for _ in range(150):
            ids = [small.bos_id]
            for _ in range(budget):                   # generate(): at most `budget` picks, <eos> included
                allowed = sorted(c(ids))
                if not allowed:                       # a dead end is allowed; running out of budget is not
                    break
                nxt = rng.choice(allowed)
                if nxt == small.eos_id:
                    break
                ids.append(nxt)
            else:
                raise AssertionError(f"no <eos> within {budget} tokens: {small.decode(ids)}")


def t_smiles_constraint_kekule_check():
    v = chemdata.Vocab(["C", "c", "(", ")", "1", "2", "=", "O", "n", "[nH]"])
    c = chemdata.SmilesConstraint(v)
    ids = lambda smiles: [v.bos_id] + [v.stoi[t] for t in chemdata.tokenize_smiles(smiles)]
    assert v.eos_id in c(ids("c1ccccc1")) and v.eos_id in c(ids("c1ccc2ccccc2c1"))
    odd = "c1cccc2cccccc12"                                     # 11 aromatic carbons: no Kekule structure
    assert not c.accepts(ids(odd) + [v.eos_id])
    assert c.accepts(ids("O=c1cc[nH]c(=O)[nH]1") + [v.eos_id])  # uracil: exocyclic C=O take the double bonds
    allowed = lambda smiles: {v.itos[i] for i in c(ids(smiles))}
    # a bond between aromatic atoms on no ring is single in RDKit: it cannot rescue two odd rings
    assert c.accepts(ids("c1ccccc1c1ccccc1") + [v.eos_id]) and not c.accepts(ids("c1cccc1c1cccc1"))
    assert not allowed("c1ccccc1c") & {"c", "C", "n"}      # a 2nd chain atom would leave the 1st on no ring
    assert "=" not in allowed("c1ccc(CC(C)cc1)(")           # a C=O there would leave c3 without a partner


@slow
def t_smiles_constraint_final_check_agrees_with_rdkit():
    """At '.' and <eos> the aromatic test runs on the frozen molecule: every aromatic atom on a ring, and
    a Kekule pairing along ring bonds only.  On uniform random walks (far stranger than any model's
    samples) RDKit then kekulizes all but a few finished molecules, the ones with an aromatic atom
    double-bonded inside a ring to a non-aromatic atom (the cheap per-prefix check let 61 of 202
    through).  The ESOL molecules all still end (t_smiles_constraint_accepts_every_esol_prefix)."""
    _need_rdkit()
    _, small, _ = _smiles_vocabs()
    c = chemdata.SmilesConstraint(small)
    rng = chemdata.random.Random(5)
    n_finished = n_kekule = 0
    for _ in range(400):
        ids, finished = _walk(c, small, rng.choice)
        if finished:
            n_finished += 1
            n_kekule += chemdata.smiles_failure_reason("".join(small.decode(ids))) == "kekulization"
    assert n_finished > 100 and n_kekule <= 0.02 * n_finished, (n_finished, n_kekule)


@slow
def t_smiles_constraint_hypothesis_walks():
    _need_rdkit()
    from hypothesis import given, settings, strategies as st
    _, small, _ = _smiles_vocabs()
    c = chemdata.SmilesConstraint(small)

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.integers(0, 10 ** 6), max_size=60))
    def check(choices):
        it = iter(choices)
        ids, finished = _walk(c, small, lambda allowed: allowed[next(it, 0) % len(allowed)], max_tokens=len(choices))
        _grammar_ok(small.decode(ids), finished)
    check()


def t_smiles_constraint_masks():
    v = chemdata.Vocab(["C", "c", "(", ")", "O", "1", "=", "#", "F", "N", "Cl", "%10", "[nH]", "n", "."])
    c = chemdata.SmilesConstraint(v)

    def allowed(smiles_tokens):
        return {v.itos[i] for i in c([v.bos_id] + [v.stoi[t] for t in smiles_tokens])}
    assert "<eos>" not in allowed([]) and ")" not in allowed([]) and "C" in allowed([])
    assert not allowed([]) & {"<pad>", "<bos>", "<unk>", "=", "(", "1"}
    assert not allowed(["C", "("]) & {"<eos>", ")", "1"}
    assert "<eos>" not in allowed(["C", "1", "C", "C"]) and "1" in allowed(["C", "1", "C", "C"])
    assert "1" not in allowed(["C", "1"])                        # no ring bond onto the same atom
    assert "1" not in allowed(["C", "1", "C"])                   # nor onto an already bonded pair
    assert allowed(["F", "F"]) == {"<eos>", "."}                 # both atoms are saturated
    assert allowed(["C", "#"]) & {"C", "N", "c", "O", "F"} == {"C", "N"}
    assert not allowed(["C", "C", "(", "C", ")", "(", "C", ")", "(", "C", ")"]) & {"(", "C", "1"}
    assert "=" not in allowed(["C", "C", "(", "C", ")", "(", "C", ")"])
    assert "%10" in allowed(["C"]) and "<eos>" in allowed(["C", "%10", "C", "C", "%10"])
    assert "<eos>" not in allowed(["c"]) and "<eos>" not in allowed(["c", "1", "c", "c"])
    assert "<eos>" in allowed(["c", "1", "c", "c", "c", "c", "c", "1"])
    assert "1" not in allowed(["c", "1", "c", "c", "c", "c"])        # an all-carbon aromatic 5-ring
    assert "1" not in allowed(["c", "1", "c", "c", "c", "c", "c", "c"])   # nor a lone 7-ring
    assert "1" in allowed(["c", "1", "c", "c", "[nH]", "c"])         # pyrrole
    assert "O" in allowed(["C", "N", "(", "=", "O", ")", "="])   # nitro N(=O)=O
    assert "C" not in allowed(["C", "N", "(", "=", "O", ")", "="])
    err = _raises(chemdata.SmilesGrammarError, c.check, [v.bos_id, v.stoi["C"], v.stoi[")"]])
    assert err.position == 2 and "')'" in str(err)
    assert c([v.bos_id, v.stoi[")"]]) == frozenset()            # an invalid prefix allows nothing
    assert c([v.stoi["C"]]) == frozenset()                      # no <bos>


def t_smiles_failure_reason():
    _need_rdkit()
    cases = {"CCO": None, "c1ccccc1": None, "CC(C": "unbalanced_branch", "CC)C": "unbalanced_branch",
             "C1CC": "unclosed_ring", "C%10CC": "unclosed_ring", "C(C)(C)(C)(C)C": "valence",
             "c1cccc1": "kekulization", "cc": "kekulization", "CC<unk>C": "unk", "": "other",
             "C1C1": "other", "C C": "other"}
    for smiles, reason in cases.items():
        assert chemdata.smiles_failure_reason(smiles) == reason, (smiles, reason)
    assert not chemdata.is_valid_smiles("C1CC")                  # a known-invalid string


def t_selfies_tokens_round_trip():
    if importlib.util.find_spec("selfies") is None:
        if _chem_required():
            raise ImportError("selfies is required (CHEM_REQUIRED) but not installed")
        raise unittest.SkipTest("selfies not installed: pip install -e '.[chem]'")
    _need_rdkit()
    for smiles in _esol().smiles[:200]:
        sf = chemdata.smiles_to_selfies(smiles)
        tokens = chemdata.tokenize_selfies(sf)
        assert "".join(tokens) == sf and all(t.startswith("[") for t in tokens)
        assert chemdata.canonical_smiles(chemdata.selfies_to_smiles(sf)) == chemdata.canonical_smiles(smiles)
    assert "'CC('" in str(_raises(ValueError, chemdata.smiles_to_selfies, "CC("))
    _raises(ValueError, chemdata.tokenize_selfies, "[C]x")


# ---------------------------------------------------------------------------
# experiments 6-8: predictors, the predict command, property helpers
# ---------------------------------------------------------------------------

def _tiny_predictor(folder, tokenizer="smiles_atom", items=("CCO", "c1ccccc1O", "CCCl", "CC(=O)O"),
                    ys=(-0.2, -0.7, -1.1, 0.9), extra=None):
    """Train a tiny TransformerEncoder for a few steps and save it with predictor meta; returns path."""
    import transformer
    tok = chemdata.PREDICTOR_TOKENIZERS[tokenizer]
    vocab = chemdata.Vocab.build([tok(s) for s in items])
    scaler = chemdata.ZScore().fit(ys)
    model = transformer.TransformerEncoder(len(vocab), d_model=8, n_heads=2, n_layers=1, max_len=64,
                                           pad_id=vocab.pad_id, seed=0)
    data = list(zip([vocab.encode(tok(s)) for s in items], scaler.transform(ys)))
    transformer.train(model, data, transformer.regression_loss, epochs=3, batch_size=2, workers=1, verbose=False)
    meta = {"tokenizer": tokenizer, "vocab_tokens": vocab.tokens, "target_mean": scaler.mean,
            "target_std": scaler.std, "units": "u", "task": "toy", "max_tokens": 12, **(extra or {})}
    path = os.path.join(folder, "tiny.json")
    transformer.save_model(model, path, meta)
    return path, model, vocab, scaler


def t_predictor_matches_the_model_and_reports_bad_inputs():
    with tempfile.TemporaryDirectory() as folder:
        path, model, vocab, scaler = _tiny_predictor(folder)
        pred = chemdata.load_predictor(path)
        want = scaler.inverse([model.forward(vocab.encode(chemdata.tokenize_smiles("CCO")))[0]])[0]
        values = pred.predict(["CCO", " CCO ", "C%%", "", "CC[Se]"])
        assert abs(values[0] - want) < 1e-12 and values[1] == values[0]
        assert values[2] is None and values[3] is None and values[4] is not None
        detail = pred.predict_detailed(["CCO", "C%%", "", "CC[Se]", "C" * 40])
        assert [d.status for d in detail[:4]] == ["unchecked", "error", "error", "out_of_domain"]   # no domain data
        assert "'%'" in detail[1].reason and detail[2].reason == "empty input" and detail[3].n_unk == 1
        assert "cut to 12 tokens" in detail[4].reason and detail[4].value is not None
        with open(path) as f:
            broken = json.load(f)
        del broken["meta"]["tokenizer"]
        bad = os.path.join(folder, "bad.json")
        with open(bad, "w") as f:
            json.dump(broken, f)
        _raises(chemdata.PredictorFormatError, chemdata.load_predictor, bad)


def t_predict_command_line_and_csv_keep_every_row():
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chemdata.py")
        proc = subprocess.run([sys.executable, script, "predict", path, "CCO", "c1ccccc1O", "C%%"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == 5 and lines[0].startswith("# model ") and lines[1].split("\t")[:3] == [
            "input", "prediction_u", "status"]
        assert lines[2].split("\t")[0] == "CCO" and lines[4].split("\t")[1:3] == ["", "error"]
        float(lines[2].split("\t")[1])
        src, out = os.path.join(folder, "in.csv"), os.path.join(folder, "out.csv")
        with open(src, "w") as f:
            f.write("name,smiles\na,CCO\nb,C%%\nc\nd,c1ccccc1O\ne,\n")
        proc = subprocess.run([sys.executable, script, "predict", path, "--csv", src, "--column", "smiles",
                               "--out", out], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        with open(out) as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["name", "smiles", "prediction_u", "status", "domain", "reason"] and len(rows) == 6
        assert [r[0] for r in rows[1:]] == ["a", "b", "c", "d", "e"]
        assert rows[1][-3] == "unchecked" and float(rows[1][-4]) and rows[4][-3] == "unchecked"
        assert rows[2][-4:-2] == ["", "error"] and rows[3][-4:-2] == ["", "error"] and "line 4" in rows[3][-1]
        proc = subprocess.run([sys.executable, script, "predict", path, "--csv", src, "--column", "nope"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "nope" in proc.stderr


def t_formula_predictor_reads_formulas_as_in_training():
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder, "formula", ("Mg2Si1", "Fe2O3", "Na1Cl1", "Ca1F6Ti1"),
                                   extra={"formula_style": "alphabetical_explicit"})
        pred = chemdata.load_predictor(path)
        a, b, c, d = pred.predict_detailed(["Mg2Si1", "SiMg2", "Xx2", "Ca3(PO4)2"])
        assert a.value == b.value and b.reason.endswith("; read as Mg2Si1")
        assert c.status == "error" and "Xx" in c.reason and d.status == "out_of_domain" and d.n_unk


def _property_common():
    """demos/property_common.py, imported as the demos import it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "demos"))
    import property_common
    return property_common


DOMAIN_TRAIN = ("CCO", "CCCO", "CCCCO", "CC(C)O", "OCCO", "CCOC", "CCCCCO", "CC(=O)O", "CCC(=O)O", "CCN",
                "c1ccccc1", "Cc1ccccc1", "Oc1ccccc1", "Clc1ccccc1", "CC/C=C/C", "C/C=C/CO")


def _domain_predictor(folder, items=DOMAIN_TRAIN):
    """A tiny ESOL-like model saved by ``property_common.save_predictor`` (so it has the SMILES preparation
    and the domain reference), its threshold chosen by ``applicability_domain``; returns (path, report)."""
    import transformer
    pc = _property_common()
    ys = [0.1 * len(s) - 1.0 for s in items]
    vocab = chemdata.Vocab.build([chemdata.tokenize_smiles(s) for s in items])
    scaler = chemdata.ZScore().fit(ys)
    model = transformer.TransformerEncoder(len(vocab), d_model=8, n_heads=2, n_layers=1, max_len=64,
                                           pad_id=vocab.pad_id, seed=0)
    path = os.path.join(folder, "dom.json")
    pc.save_predictor(model, path, tokenizer="smiles_atom", vocab=vocab, scaler=scaler, units="log10(mol/L)",
                      task="toy solubility", train_items=list(items), train_y=ys, extra={"valid_rmse": 0.5})
    held_out = ["CCCCCCO", "CC(O)CO", "Brc1ccccc1", "CCCO", "CCCCCCCCCCCCCCCCCCCCCCCCCO"]
    n = len(items)
    idx = (list(range(n)), [n, n + 1, n + 2], [n + 3, n + 4])
    preds = {"valid": [0.1, 0.1, 0.9], "test": [0.1, 2.0]}
    return path, pc.applicability_domain(path, list(items) + held_out, ys + [0.0, 0.1, 0.2, 0.0, 0.0], idx, preds)


def t_predictor_one_molecule_one_prediction():
    """4 spellings each of benzene, caffeine and aspirin give identical predictions with the
    committed ESOL model (inputs are read as their RDKit canonical SMILES); isomeric SMILES of a model
    trained without such marks are read without them ('stereo ignored', not unk); the committed model says
    how its training SMILES were written (the share that was RDKit-canonical, or "as written" in a model
    saved before that was recorded)."""
    _need_rdkit()
    root = os.path.dirname(os.path.abspath(__file__))
    pred = chemdata.load_predictor(os.path.join(root, "models", "esol_transformer.json"))
    spellings = {"benzene": ["c1ccccc1", "C1=CC=CC=C1", "C(=C1)C=CC=C1", "C=1C=CC=CC=1"],
                 "caffeine": ["CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "Cn1cnc2c1c(=O)n(C)c(=O)n2C",
                              "O=C1N(C)C(=O)c2c(ncn2C)N1C", "CN1C(=O)N(C)c2ncn(C)c2C1=O"],
                 "aspirin": ["CC(=O)Oc1ccccc1C(=O)O", "OC(=O)c1ccccc1OC(C)=O", "O=C(O)c1ccccc1OC(=O)C",
                             "C(C)(=O)Oc1c(C(O)=O)cccc1"]}
    for name, forms in spellings.items():
        values = pred.predict(forms)
        assert len(set(values)) == 1 and values[0] is not None, (name, values)
    assert chemdata.canonical_smiles(spellings["caffeine"][0]) != spellings["caffeine"][0]   # really re-spelt
    glucose = "OC[C@H]1OC(O)[C@H](O)[C@@H](O)[C@@H]1O"
    a, b = pred.predict_detailed([glucose, "OCC1OC(O)C(O)C(O)C1O"])
    assert a.value == b.value and a.status == b.status != "out_of_domain" and "stereo ignored" in a.reason
    assert "stereo ignored" not in b.reason and "[C@H]" not in a.prepared
    prep = pred.preparation                 # the model says how its training SMILES were written
    assert prep["trained_on_canonical"] is False
    assert (f"{prep['canonical_fraction']:.0%} were RDKit-canonical" if prep["recorded"] else "as written") \
        in pred.describe()
    nitro, biphenyl = pred.predict_detailed(["[O-][N+](=O)c1ccccc1", "c1ccc(-c2ccccc2)cc1"])   # RDKit's forms
    assert (nitro.prepared, nitro.n_unk, biphenyl.prepared, biphenyl.n_unk) == (
        "O=N(=O)c1ccccc1", 0, "c1ccc(c2ccccc2)cc1", 0)            # written as ESOL writes them: no <unk>
    assert "-1" in str(_raises(ValueError, chemdata.Predictor, pred.model, pred.meta, n_random=-1))
    assert "'9'" in str(_raises(TypeError, chemdata.Predictor, pred.model, pred.meta, max_input_tokens="9"))


def t_predictor_without_rdkit_checks_nothing():
    """Bad input: without RDKit a SMILES is 'unchecked' (validity not checked), never ok."""
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        pred = chemdata.load_predictor(path)
        import predictor
        real = predictor.rdkit_available                   # the name predictor.py looks up
        predictor.rdkit_available = lambda: False
        try:
            res = pred.predict_detailed(["C1CC", "CCO"])
        finally:
            predictor.rdkit_available = real
        assert [r.status for r in res] == ["unchecked", "unchecked"] and all(r.value is not None for r in res)
        assert "RDKit not installed" in res[0].reason


def t_predictor_applicability_domain():
    """unseen tokens, a length beyond the training range and a nearest-neighbour Tanimoto
    under the threshold chosen on the validation split are out_of_domain with the reason; a training
    molecule is in; a model file without a training reference says 'domain not checked'."""
    _need_rdkit()
    with tempfile.TemporaryDirectory() as folder:
        path, report = _domain_predictor(folder)
        pred = chemdata.load_predictor(path)
        threshold = pred.reference["threshold"]
        assert report["threshold"] == threshold and 0 < threshold < 1 and "validation" in report["rule"]
        assert report["valid"]["n_in"] + report["valid"]["n_out"] == 3 and report["test"]["n_out"] >= 1
        assert pred.preparation["recorded"] and pred.preparation["stereo_in_training"] == {
            "chiral": False, "double_bond": True}
        a, b, c, d, e = pred.predict_detailed(["OCC", "CC[Se]C", "C" * 30 + "O", "c1ccc2ccccc2c1", "C/C=C/CO"])
        assert (a.status, a.domain, a.similarity) == ("ok", "in", 1.0) and e.status == "ok"
        assert b.status == "out_of_domain" and "unseen in training" in b.reason
        assert c.status == "out_of_domain" and "outside the training range 3-9" in c.reason and c.similarity > 0.9
        assert d.status == "out_of_domain" and d.similarity < threshold and "similarity" in d.reason
        with open(path) as f:
            meta = json.load(f)["meta"]
        assert len(meta["domain"]["train_fingerprints_hex"]) == len(DOMAIN_TRAIN)
        avg = chemdata.Predictor(pred.model, pred.meta, path, n_random=3)
        means = avg.predict(["OC(C)CC", "CCC(C)O", "C(C)(O)CC"])
        assert len(set(means)) == 1 and means[0] != pred.predict(["CCC(C)O"])[0]
        assert "3 random SMILES" in avg.predict_detailed(["CCO"])[0].reason and "4 spellings" in avg.describe()
        path2, *_ = _tiny_predictor(folder)
        r = chemdata.load_predictor(path2).predict_detailed(["CCO"])[0]
        assert (r.status, r.domain) == ("unchecked", "not checked") and chemdata.NO_REFERENCE in r.reason


def t_predictor_length_limit_answers_at_once():
    """an input over the stated token limit is refused at once (error, reason with the
    limit); the limit can be raised."""
    import time
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        pred = chemdata.load_predictor(path)
        t0 = time.perf_counter()
        r = pred.predict_detailed(["C" * 5000])[0]
        assert time.perf_counter() - t0 < 2 and r.status == "error" and r.value is None
        assert f"over the input limit of {chemdata.DEFAULT_MAX_INPUT_TOKENS}" in r.reason
        assert chemdata.load_predictor(path, max_input_tokens=600).predict(["C" * 500])[0] is not None


def t_predict_csv_survives_real_files():
    """a CSV with a BOM, a Latin-1 byte, ragged, empty, invalid, stereo and out-of-domain
    rows: every row is kept with the header's columns and gets its expected status; the output has
    prediction_<units>, status, domain, reason; --out into a missing folder is an error that writes nothing."""
    _need_rdkit()
    with tempfile.TemporaryDirectory() as folder:
        path, _ = _domain_predictor(folder)
        src = os.path.join(folder, "in.csv")
        lines = ["name,smiles,note", "ethanol,CCO,x", "caf\xe9,OCC,latin-1 name", "ragged,CCCO,a,b",
                 "short,CCCCO", "", "bad,C1CC,x", "stereo,C[C@H](O)CC,x", "far,c1ccc2ccccc2c1,x",
                 "unseen,CC[Se]C,x", "long," + "C" * 900 + ",x", "huge," + "C" * 140000 + ",x", "last,CCO,x"]
        with open(src, "wb") as f:
            f.write(b"\xef\xbb\xbf" + "\n".join(lines).encode("latin-1") + b"\n")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chemdata.py")
        out = os.path.join(folder, "out.csv")
        proc = subprocess.run([sys.executable, script, "predict", path, "--csv", src, "--out", out],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "read as Latin-1" in proc.stderr and "line 3" in proc.stderr and "validation RMSE 0.5" in proc.stderr
        with open(out, encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["name", "smiles", "note", "prediction_log10(mol/L)", "status", "domain", "reason"]
        assert all(len(r) == 7 for r in rows) and rows[2][0] == "café"
        want = ["ok", "ok", "error", "ok", "error", "invalid", "ok", "out_of_domain", "out_of_domain", "error",
                "error", "ok"]
        assert [r[4] for r in rows[1:]] == want, [r[4:] for r in rows[1:]]
        assert "line 4 has 4 fields" in rows[3][6] and rows[3][3] == "" and "line 5 has 2" in rows[4][6]
        assert "line 6 is empty" in rows[5][6] and "stereo ignored" in rows[7][6] and rows[8][5] == "out"
        assert "over the input limit" in rows[10][6] and "line 12: field larger" in rows[11][6]
        missing = os.path.join(folder, "nope", "out.csv")
        proc = subprocess.run([sys.executable, script, "predict", path, "--csv", src, "--out", missing],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "does not exist" in proc.stderr
        assert not os.path.exists(os.path.dirname(missing))
        _raises(ValueError, chemdata.predict_csv, chemdata.load_predictor(path), src, "smiles", src)
        with open(src, "rb") as f:
            assert f.read().startswith(b"\xef\xbb\xbf")          # the input is untouched
        empty = os.path.join(folder, "empty.csv")
        open(empty, "w").close()
        _raises(chemdata.DatasetFormatError, chemdata.predict_csv, chemdata.load_predictor(path), empty, "smiles")


def t_formula_reordering_keeps_the_composition():
    import random
    assert chemdata.formula_reordered("Ca1F6Ti1", [2, 0, 1]) == "Ti1Ca1F6"
    _raises(ValueError, chemdata.formula_reordered, "Ca1F6Ti1", [0, 0, 1])
    _raises(ValueError, chemdata.formula_reordered, "Ca3(PO4)2", [0, 1, 2])
    assert chemdata.formula_orders("Fe2", 3, random.Random(0)) == []
    assert chemdata.formula_orders("Fe2O3", 3, random.Random(0)) == ["O3Fe2"]
    others = chemdata.formula_orders("Ca1F6O3Ti1", 5, random.Random(1))
    assert len(set(others)) == 5 and "Ca1F6O3Ti1" not in others
    assert all(chemdata.reduced_formula(f) == chemdata.reduced_formula("Ca1F6O3Ti1") for f in others)


def t_molecule_helpers():
    import random
    _need_rdkit()
    variants = chemdata.randomized_smiles("OCc1ccccc1Cl", 6, random.Random(0))
    assert len(variants) == 6 and len(set(variants)) > 1
    assert {chemdata.canonical_smiles(v) for v in variants} == {chemdata.canonical_smiles("OCc1ccccc1Cl")}
    assert variants == chemdata.randomized_smiles("OCc1ccccc1Cl", 6, random.Random(0))
    logp, mw, rot, arom = chemdata.esol_descriptors("c1ccccc1O")
    assert abs(mw - 94.113) < 0.01 and rot == 0 and abs(arom - 6 / 7) < 1e-12
    fr = chemdata.molecule_element_fractions("CCO")
    assert abs(fr[chemdata.FRACTION_ELEMENTS.index("H")] - 6 / 9) < 1e-12 and abs(sum(fr) - 1) < 1e-12
    _raises(ValueError, chemdata.esol_descriptors, "C1CC")


def t_element_features_periodic_table():
    """Period and group from the atomic number (f-block in group 3), RDKit's values, z-scored columns."""
    _need_rdkit()
    expect = {"H": (1, 1), "He": (1, 18), "B": (2, 13), "Na": (3, 1), "Zn": (4, 12), "Kr": (4, 18), "La": (6, 3),
              "Hf": (6, 4), "Au": (6, 11), "U": (7, 3)}
    raw = chemdata.element_features(list(expect), standardize=False)
    names = chemdata.ELEMENT_FEATURE_NAMES
    for sym, (period, group) in expect.items():
        f = dict(zip(names, raw[sym]))
        assert (f["period"], f["group"]) == (period, group), sym
        assert f["f_block"] == (1.0 if sym in ("La", "U") else 0.0)
    assert dict(zip(names, raw["Au"]))["atomic_number"] == 79.0
    z = chemdata.element_features(list(expect))
    for col in zip(*z.values()):
        assert abs(sum(col)) < 1e-9
    vocab = chemdata.Vocab.build([chemdata.tokenize_formula("Mg2Si1")])
    rows = chemdata.token_feature_matrix(vocab, chemdata.element_features(["Mg", "Si"]))
    assert len(rows) == len(vocab) and rows[vocab.stoi["2"]] == [0.0] * len(names)
    try:
        chemdata.element_features(["Xx"])
    except ValueError as e:
        assert "Xx" in str(e)
    else:
        raise AssertionError("an unknown symbol must raise")


def _finish_by_enumeration(c, st, room):
    """Ground truth for SmilesConstraint._finishable: does any sequence of at most ``room`` ids, each in the
    unfiltered allowed set of the state before it ('.' included), end with <eos>?"""
    if room <= 0:
        return False
    base = c._allowed(st)
    return c.eos_id in base or any(_finish_by_enumeration(c, c._advance(st, t), room - 1) for t in base)


@slow
def t_smiles_constraint_finishable_is_sound():
    """The budget search never claims a way to <eos> that enumerating every continuation does not find;
    it says "no" only where the cautious estimate rules the shorter completions out (measured here)."""
    v = chemdata.Vocab(["C", "c", "n", "O", "(", ")", "1", "2", "=", "[nH]", "."])
    c = chemdata.SmilesConstraint(v)
    c.SEARCH_NODES = 10 ** 6                          # never cut short here
    rng = chemdata.random.Random(3)
    n_yes = n_no = n_cautious = 0
    for _ in range(40):
        ids, _ = _walk(c, v, rng.choice, max_tokens=rng.randrange(1, 12))
        st = c._state(tuple(ids))
        if st is None or st.prev == "end":
            continue
        for room in range(1, 5):
            truth, got = _finish_by_enumeration(c, st, room), c._finishable(st, room)
            assert truth or not got, (v.decode(ids), room)
            n_yes, n_no = n_yes + truth, n_no + (not truth)
            n_cautious += truth and not got
    assert n_yes > 20 and n_no > 20, (n_yes, n_no)    # both answers were exercised
    assert n_cautious < n_yes / 2, (n_cautious, n_yes)


def t_smiles_constraint_double_bonds_on_aromatic_atoms():
    """'=' touching an aromatic atom only as the exocyclic c=O or c=S of ESOL (RDKit rejects C=c, c=c and
    c1=S... at kekulization), and the thione S takes no further bond."""
    v = chemdata.Vocab(["C", "c", "n", "O", "S", "(", ")", "1", "2", "=", "[nH]"])
    c = chemdata.SmilesConstraint(v)
    ids = lambda smiles: [v.bos_id] + [v.stoi[t] for t in chemdata.tokenize_smiles(smiles)]
    allowed = lambda smiles: {v.itos[i] for i in c(ids(smiles))}
    assert allowed("c1cc(=") == {"O", "S"}                 # not C, c, n, nor a ring bond that could never close
    assert "c" not in allowed("CC=") and "C" in allowed("CC=")
    assert "C" not in allowed("c1ccc(=S") and ")" in allowed("c1ccc(=S")  # the thione S is terminal
    assert c.accepts(ids("Cc1cc(=O)[nH]c(=S)[nH]1") + [v.eos_id])       # the ESOL molecule with c=S
    assert not c.accepts(ids("C=c1ccccc1"))


def t_closing_partners_of_rings_and_branches():
    """Experiment 5: every closing ring label and ')' points at its opener; a reused label opens a new
    ring; '%12' is one label; a ')' without '(' and an unclosed ring are named errors at their token."""
    toks = chemdata.tokenize_smiles("c1ccc(C(=O)O)cc1C2CC2")
    got = {i: p for i, p in enumerate(chemdata.closing_partners(toks)) if p}
    assert got == {10: ("branch", 7), 12: ("branch", 5), 15: ("ring", 1), 20: ("ring", 17)}, got
    toks = chemdata.tokenize_smiles("C1CC1C1CC1")                          # the label 1 used twice
    assert [p for p in chemdata.closing_partners(toks) if p] == [("ring", 1), ("ring", 6)]
    assert chemdata.closing_partners(chemdata.tokenize_smiles("C%12CC%12"))[4] == ("ring", 1)
    assert chemdata.closing_partners([]) == []
    err = _raises(chemdata.SmilesGrammarError, chemdata.closing_partners, ["C", ")", "C"])
    assert err.position == 1 and err.tokens == ["C", ")", "C"]
    err = _raises(chemdata.SmilesGrammarError, chemdata.closing_partners, ["C", "1", "C", "(", "C"])
    assert err.position == 1 and "never closed" in str(err)


def t_smiles_constraint_length_budget_from_training_lengths():
    budget = chemdata.SmilesConstraint.length_budget
    lists = [["C"] * n for n in range(1, 101)]              # token counts 1..100, with <eos> 2..101
    assert budget(lists, quantile=0.99, margin=0) == 100 and budget(lists, quantile=0.5, margin=3) == 54
    assert budget(lists) == 100 + chemdata.SmilesConstraint.LENGTH_MARGIN
    for bad in (dict(token_lists=[]), dict(token_lists=lists, quantile=0), dict(token_lists=lists, quantile=1.5)):
        try:
            budget(**bad)
        except ValueError as e:
            assert "length_budget" in str(e)
        else:
            raise AssertionError(f"no ValueError for {bad}")


def t_smiles_constraint_counts_undos_and_forced_closures():
    """The per-sample counters H3's demo stores: a call whose prefix is not longer than the previous one's
    is an undo; a forced closure is a prefix where the budget removed an id the plain grammar allows."""
    _need_rdkit()
    _, small, _ = _smiles_vocabs()
    bos, ids = small.bos_id, small.encode(["C", "C", "(", "C", "C", "C"])[1:-1]
    c, free = chemdata.SmilesConstraint(small, max_new_tokens=8), chemdata.SmilesConstraint(small)
    c.begin()
    forced = 0
    for t in range(len(ids) + 1):
        prefix = [bos] + ids[:t]
        forced += c(prefix) != free(prefix)
    assert forced > 0 and c.sample_stats() == {"undos": 0, "forced_closures": forced}
    c([bos] + ids[:3])                                       # generate(backtrack=) asking again, shorter
    c([bos] + ids[:3])
    assert c.sample_stats()["undos"] == 2
    c.begin()
    assert c.sample_stats() == {"undos": 0, "forced_closures": 0}
    free.begin()
    for t in range(len(ids) + 1):
        free([bos] + ids[:t])
    assert free.sample_stats() == {"undos": 0, "forced_closures": 0}      # no budget, nothing forced


def t_smiles_constraint_with_length_budget_samples_parse():
    """generate with the training-length budget and backtracking: every sample ends with <eos> within the
    budget and never fails on grammar (branches, rings, valence, <unk>); the counters are consistent."""
    _need_rdkit()
    _, small, tokens = _smiles_vocabs()
    import transformer as tf
    budget = chemdata.SmilesConstraint.length_budget(tokens, quantile=0.5)
    c = chemdata.SmilesConstraint(small, max_new_tokens=budget)
    model = tf.TransformerLM(len(small), d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=128, seed=4)
    seen = chemdata.Counter()
    for seed in range(12):
        c.begin()
        new, reason = tf.generate(model, [small.bos_id], 100, rng=seed, eos_id=small.eos_id, constraint=c,
                                  backtrack=20, return_reason=True)
        stats = c.sample_stats()
        assert stats["undos"] <= 20, stats
        seen.update({"eos": reason == "eos", "undos": stats["undos"] > 0, "forced": stats["forced_closures"] > 0})
        if reason == "no_allowed_token":
            assert stats["undos"] == 20, stats               # a dead end only once the undos are spent
            continue
        assert reason == "eos" and len(new) < budget, (reason, len(new), budget)
        failure = chemdata.smiles_failure_reason("".join(small.decode(new)))
        assert failure not in ("unbalanced_branch", "unclosed_ring", "unk", "valence"), (failure, new)
    assert seen["eos"] >= 8 and seen["undos"] >= 1 and seen["forced"] >= 1, seen   # the counters are exercised


# ----------------------------------------------------------------------------- experiment 4: n-gram, distribution


def _ngram_data():
    rng = __import__("random").Random(3)
    seqs = [[1] + [rng.randrange(4, 9) for _ in range(rng.randrange(1, 7))] + [2] for _ in range(40)]
    return seqs, chemdata.NgramLM(10, n=4, discount=0.75, bos_id=1).fit(seqs)


def t_ngram_probabilities_sum_to_one_after_every_prefix():
    """After every prefix (seen, unseen, of every length; ids never seen included) the n-gram's next-token
    distribution sums to 1 over the whole vocabulary, every id has p > 0, and next_logits = log p."""
    seqs, m = _ngram_data()
    for seq in seqs[:10] + [[1, 9, 9, 3, 0], [1]]:
        for t in range(1, len(seq) + 1):
            p = m.probs(seq[:t])
            assert len(p) == 10 and abs(math.fsum(p) - 1.0) < 1e-12 and min(p) > 0, (seq[:t], p)
            assert max(abs(a - math.log(b)) for a, b in zip(m.next_logits(seq[:t]), p)) < 1e-12


def t_ngram_choice_on_validation_and_bad_input():
    """fit_ngram picks the (n, discount) of lowest validation bits/token from its grid; a higher order fits
    the training data at least as well here; bad arguments raise ValueError naming the value."""
    seqs, _ = _ngram_data()
    best, grid = chemdata.fit_ngram(seqs[:30], seqs[30:], 10, 1, orders=(1, 2, 3), discounts=(0.5, 0.9))
    assert len(grid) == 6 and min(g["valid_bits_per_token"] for g in grid) == \
        chemdata.ngram_bits_per_token(best, seqs[30:])
    for bad in (dict(n=0), dict(discount=1.0), dict(n=2.5)):
        with contextlib.suppress(ValueError):
            chemdata.NgramLM(10, **bad)
            raise AssertionError(f"no ValueError for {bad}")
    with contextlib.suppress(ValueError):
        chemdata.NgramLM(10, n=2).fit([[1, 12, 2]])
        raise AssertionError("no ValueError for an id outside the vocabulary")


def t_tutorial_novelty_known_answer():
    """Hand-made: 6 samples, 1 invalid (None: e.g. no <eos>), 1 unparsable, 4 valid of which 3 unique
    (CCO twice, spelled two ways); the training set holds CCO.  The tutorial's novelty = novel unique /
    unique valid = 2/3; ours (novel valid / valid) = 2/4; uniqueness = unique valid / n = 3/6."""
    _need_rdkit()
    train = {chemdata.canonical_smiles("CCO")}
    r = chemdata.tutorial_novelty(["CCO", "OCC", "c1ccccc1", "CCN", None, "C1CC"], train)
    assert (r["n_valid"], r["n_unique_valid"]) == (4, 3)
    assert r["validity"] == 4 / 6 and r["uniqueness"] == 3 / 6
    assert abs(r["novelty"] - 2 / 3) < 1e-12 and r["novelty_of_valid"] == 2 / 4


def t_tutorial_scores_by_block_known_answer():
    """Blocks of 3 over 7 canonical samples (the 7th, an incomplete block, is left out).  Block 1: CCO
    twice and None -> validity 2/3, uniqueness 1/3, novelty 0 (CCO is in training); block 2: CCN, CCC,
    CCN -> 1, 2/3, 1.  Means 5/6, 1/2, 1/2; sample sd sqrt(1/2) x the gap.  Fewer samples than one block: None."""
    blocks = chemdata.tutorial_scores_by_block(["CCO", "CCO", None, "CCN", "CCC", "CCN", "CO"], {"CCO"}, 3)
    assert (blocks["size"], blocks["blocks"]) == (3, 2)
    for key, (a, b) in {"validity": (2 / 3, 1.0), "uniqueness": (1 / 3, 2 / 3), "novelty": (0.0, 1.0)}.items():
        assert abs(blocks[key]["mean"] - (a + b) / 2) < 1e-12, key
        assert abs(blocks[key]["sd"] - abs(a - b) / math.sqrt(2)) < 1e-12, key
    one = chemdata.tutorial_scores_by_block([None, None], set(), 2)
    assert one["blocks"] == 1 and one["validity"] == {"mean": 0.0, "sd": None} and one["novelty"]["mean"] is None
    assert chemdata.tutorial_scores_by_block(["CCO"], set(), 2) is None


def t_moses_metrics_known_values():
    """IntDiv1 of one molecule repeated is 0 (pairs i = j count, as MOSES); SNN of the reference itself is
    1; Frag and Scaf of a set against itself are 1; an acyclic set has no scaffold (None)."""
    _need_rdkit()
    ref = ["c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N"]
    m = chemdata.moses_metrics(ref, ref)
    assert abs(m["snn"] - 1) < 1e-12 and abs(m["frag"] - 1) < 1e-12 and abs(m["scaf"] - 1) < 1e-12
    assert chemdata.moses_metrics(["CCO"] * 3, ref)["int_div1"] == 0.0
    assert chemdata.moses_metrics(["CCO", "CCC"], ["CCN"])["scaf"] is None
    assert chemdata.length_histogram([0, 4, 5, 99, 250], edges=(0, 5, 100))["counts"] == [2, 3]


@slow
def t_guacamol_kl_and_fcd_on_a_tiny_set():
    """GuacaMol's KLDivBenchmark and fcd.get_fcd's steps run on a tiny set: a set against itself scores
    KL 1.0 and FCD ~0 (score ~1); a different set scores lower.  Skipped without the packages, except in
    CI (REQUIRE_CHEM=1), where they are installed and must run."""
    _need_rdkit()
    if not chemdata.distribution_packages_available():
        if _chem_required():
            raise ImportError(f"REQUIRE_CHEM=1 but guacamol / fcd are missing: {chemdata.GUACAMOL_HINT}")
        raise unittest.SkipTest(f"guacamol / fcd not installed ({chemdata.GUACAMOL_HINT})")
    ref = ["CCO", "c1ccccc1O", "CCOC(=O)c1ccccc1", "C1CCCCC1N", "CC(C)Cl", "OC(=O)CCc1ccccc1", "CCCCBr",
           "Nc1ccc(Cl)cc1"]
    other = ["CCCCCCCC", "CCCCCCO", "C1CCCCC1", "CCCCCCCCCl", "c1ccncc1", "CCC(C)CCCC", "OCCO"]
    same, diff = chemdata.guacamol_kl_score(ref, ref), chemdata.guacamol_kl_score(other, ref)
    assert abs(same["score"] - 1.0) < 1e-9 and diff["score"] < same["score"], (same, diff)
    f_same, f_diff = chemdata.fcd_score(ref, ref), chemdata.fcd_score(other, ref)
    assert f_same["fcd"] < 1e-3 and f_diff["fcd"] > 1 and f_diff["score"] < f_same["score"], (f_same, f_diff)
    import fcd               # fcd_score keeps ChemNet in memory: it equals get_fcd on RDKit-canonical SMILES
    canon = chemdata.canonical_smiles
    want = fcd.get_fcd([canon(x) for x in other], [canon(x) for x in ref])
    assert abs(f_diff["fcd"] - want) < 1e-6 * max(1.0, want), (f_diff, want)
    assert set(chemdata.distribution_package_versions()) == {"guacamol", "fcd"}
    assert chemdata.guacamol_kl_score(["CCO"], ref)["score"] is None        # too few: None with the reason
    # at a fixed size: a set no larger is scored once, whole; a larger one as the mean over seeded subsets
    whole = chemdata.kl_score_at_size(other, ref, size=len(other))
    assert whole["repeats"] == 1 and whole["mean"] == diff["score"] and whole["sd"] == 0.0, whole
    sub = chemdata.kl_score_at_size(ref + other, ref, size=5, repeats=3, seed=1)
    assert sub["size"] == 5 and sub["repeats"] == 3 and len(sub["scores"]) == 3
    assert abs(sub["mean"] - sum(sub["scores"]) / 3) < 1e-12 and sub == chemdata.kl_score_at_size(
        ref + other, ref, size=5, repeats=3, seed=1)



def t_readme_predict_example_is_a_real_run():
    """The README's "Predict a property" output block is what its commands (lines starting "$ ") print today,
    line for line."""
    _need_rdkit()
    import shlex
    root = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    marker = "<!-- predict example: tests_chemdata.py runs the command and compares every line -->"
    assert marker in text, "the README's predict example lost its marker"
    block = text.split(marker, 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block[0].startswith("$ python chemdata.py predict "), block[0]
    starts = [i for i, line in enumerate(block) if line.startswith("$ ")] + [len(block)]
    for a, b in zip(starts, starts[1:]):
        argv = shlex.split(block[a][2:])
        out = subprocess.run([sys.executable] + argv[1:], cwd=root, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == block[a + 1:b], f"README differs from a real run of {block[a]}:\n{out.stdout}"


def t_csv_not_utf8_names_the_right_line_after_a_bom():
    """The first non-UTF-8 line is counted in the file as written, BOM or not (the byte right after a newline)."""
    with tempfile.TemporaryDirectory() as d:
        for bom in (b"", b"\xef\xbb\xbf"):
            path = os.path.join(d, "x.csv")
            with open(path, "wb") as f:
                f.write(bom + b"smiles\nCCO\n\xe9\nCCN\n")
            encoding, note = chemdata._scan_csv(path)
            assert encoding == "latin-1" and "(line 3 first)" in note, (bom, note)
            records = list(importlib.import_module("predictor")._csv_records(path, encoding))
            assert [r[1] for r in records] == [["smiles"], ["CCO"], ["\xe9"], ["CCN"]], records


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
