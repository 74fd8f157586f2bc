"""The predictor (predictor.py) and its files and command (predict_files.py: ``chem-transformer-predict``,
``python predict_files.py`` in a checkout; the ``python chemdata.py predict`` alias) on real files and
hostile inputs: the output is checked before any work, the model file's meta whole at load, inputs are lists
of strings, output fields never split, a file is read as a stream (binary files refused at once), each
distinct input is predicted once, the parallel path equals the serial one, and an interrupted run keeps its
rows and is finished by the command it prints, with output identical to an uninterrupted run.  The last
section: the predictor's meaning (tiny trained models, the applicability domain, the committed models and the
README's examples).  Special files are made in temp folders, never in the system's /dev.

    python -m pytest tests/tests_predictor.py
"""
import contextlib
import csv
import hashlib
import importlib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from unittest import mock

import pytest

import chemdata
import formulas
import evaluation
import predict_files as pf
import predictor as pr
import safe_io
from tests_chemdata import _need_rdkit, _raises
from tests_commands import _default_sigint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "predict_files.py")
"""The predict command as a checkout runs it (``chem-transformer-predict`` once installed: predict_files:main)."""


def _predict(*argv, timeout=300):
    """``python predict_files.py ARGV...`` in a subprocess: (exit status, stdout, stderr), decoded as
    written (no newline translation: a carriage return in the output stays one)."""
    proc = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True,
                          timeout=timeout, env=dict(os.environ, CHEMDATA_OFFLINE="1"))
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


def _write_csv(path, rows, header=("name", "smiles"), quoting=csv.QUOTE_MINIMAL):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n", quoting=quoting)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _special_files(folder):
    """A FIFO, a character device node like /dev/full (1, 7) (a UNIX socket where mknod is not
    permitted) and a symbolic link to the FIFO, made in ``folder``: {name: (path, lstat kind test)}."""
    fifo = os.path.join(folder, "pipe")
    os.mkfifo(fifo)
    node = os.path.join(folder, "full")
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 7))
        node_kind = stat.S_ISCHR
    except PermissionError:
        s = socket.socket(socket.AF_UNIX)
        s.bind(node)
        s.close()
        node_kind = stat.S_ISSOCK
    link = os.path.join(folder, "link")
    os.symlink(fifo, link)
    return {"fifo": (fifo, stat.S_ISFIFO), "device": (node, node_kind), "link": (link, stat.S_ISLNK)}


# ---------------------------------------------------------------------------
# item 1: --out is checked before any prediction, and never replaces a special file
# ---------------------------------------------------------------------------

def t_predict_out_refuses_special_files_before_predicting(tmp_path):
    model, *_ = _tiny_predictor(str(tmp_path))
    src = _write_csv(tmp_path / "in.csv", [["a", "CCO"], ["b", "CCCO"]])
    specials = _special_files(str(tmp_path))
    for name, (path, is_kind) in specials.items():
        rc, out, err = _predict(model, "--csv", str(src), "--out", path)
        assert rc == 2 and "refusing to write" in err and out == "", (name, rc, err)
        assert is_kind(os.lstat(path).st_mode), name                # still a FIFO / device / link
    assert sorted(os.listdir(tmp_path)) == ["full", "in.csv", "link", "pipe", "tiny.json"]
    rc, _, err = _predict(model, "--csv", str(src), "--out", str(src))
    assert rc == 2 and "input" in err and open(src).read().startswith("name,smiles\n")
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o500)
    if not os.access(read_only, os.W_OK):                 # root may write anywhere: then the check is moot
        rc, _, err = _predict(model, "--csv", str(src), "--out", str(read_only / "out.csv"))
        assert rc == 2 and "not writable" in err, err
    read_only.rmdir()
    pred = pr.load_predictor(model)
    with mock.patch.object(pred, "outcomes", side_effect=AssertionError("predicted before the check")):
        for path, _ in specials.values():
            with pytest.raises(safe_io.UnsafeOutputError):
                pf.predict_csv(pred, str(src), "smiles", path)
        fifo_partial = tmp_path / "out.csv.partial"                # the partial file is checked too
        os.mkfifo(fifo_partial)
        with pytest.raises(safe_io.UnsafeOutputError):
            pf.predict_csv(pred, str(src), "smiles", str(tmp_path / "out.csv"))
        assert stat.S_ISFIFO(os.lstat(fifo_partial).st_mode) and not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------------------
# item 7: the model file's meta is validated whole at load
# ---------------------------------------------------------------------------

def _with_meta(folder, source, name, **changes):
    """A copy of model file ``source`` with meta keys changed (a value None deletes the key); nested
    changes as 'domain.key'."""
    with open(source, encoding="utf-8") as f:
        obj = json.load(f)
    for key, value in changes.items():
        block, _, key = key.rpartition("__")
        meta = obj["meta"][block] if block else obj["meta"]
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)                                          # NaN written as NaN, as json allows
    return path


def t_model_meta_is_checked_whole_at_load(tmp_path):
    """A NaN, zero or string target_std, a domain without token_length_range or with an unreadable
    fingerprint, a string valid_rmse: each is a PredictorFormatError at load naming the field and value,
    and the command exits 2 before printing anything."""
    _need_rdkit()
    good, _ = _domain_predictor(str(tmp_path))
    cases = {"target_std": (math.nan, "nan"), "target_mean": (math.inf, "inf"), "valid_rmse": ("0.5", "'0.5'"),
             "domain__token_length_range": (None, "missing"), "domain__threshold": ("high", "'high'"),
             "domain__train_fingerprints_hex": (["zz"], "unreadable training reference"),
             "max_tokens": (0, "0"), "units": (7, "7")}
    for i, (key, (value, shown)) in enumerate(cases.items()):
        bad = _with_meta(str(tmp_path), good, f"bad{i}.json", **{key: value})
        with pytest.raises(pr.PredictorFormatError) as e:
            pr.load_predictor(bad)
        assert bad in str(e.value) and key.split("__")[-1] in str(e.value) and shown in str(e.value), str(e.value)
    zero = _with_meta(str(tmp_path), good, "zero.json", target_std=0.0)
    rc, out, err = _predict(zero, "CCO")
    assert rc == 2 and out == "" and "target_std must be a finite number > 0, got 0.0" in err, err
    rc, out, err = _predict(_with_meta(str(tmp_path), good, "nodom.json", domain__token_length_range=None), "CCO")
    assert rc == 2 and out == "" and "token_length_range" in err and "KeyError" not in err, err


# ---------------------------------------------------------------------------
# item 8: dative bonds, exact formula amounts, errors that quote the user's input
# ---------------------------------------------------------------------------

_OLD_SMILES_TOKEN = re.compile(            # the tokenizer's pattern before dative bonds were accepted
    r"\[[0-9]*[A-Za-z*][A-Za-z0-9@+\-:]*\]|Br|Cl|>>|%[0-9]{2}|[BCNOPSFI]|[bcnops]|\*|[0-9]|[-=#$:/\\().>]")


def _dataset_smiles():
    """Every SMILES string of ESOL, HOPV and USPTO-50K (reactions), as the loaders give them."""
    esol, hopv, uspto = chemdata.load_esol(), chemdata.load_hopv(), chemdata.load_uspto50k()
    return list(esol.smiles) + list(hopv.smiles) + [r for r in uspto.reactions]


def t_dative_bonds_are_tokens_and_change_no_dataset_sequence():
    """RDKit writes cisplatin's ligands with dative bonds; '->' and '<-' are tokens now, so it is predicted
    (out of domain: unseen tokens), and no ESOL/HOPV/USPTO string tokenizes differently than before."""
    assert chemdata.tokenize_smiles("[NH3]->[Pt](<-[NH3])(Cl)Cl") == [
        "[NH3]", "->", "[Pt]", "(", "<-", "[NH3]", ")", "(", "Cl", ")", "Cl"]
    try:
        strings = _dataset_smiles()
    except (chemdata.DatasetNotFoundError, OSError) as e:
        pytest.skip(f"datasets not available: {e}")
    assert len(strings) > 50000
    changed = [s for s in strings if chemdata.tokenize_smiles(s) != _OLD_SMILES_TOKEN.findall(s)]
    assert changed == [], changed[:5]
    _need_rdkit()
    esol = pr.load_predictor(os.path.join(ROOT, "models", "esol_transformer.json"))
    cis = esol.predict_detailed(["Cl[Pt](Cl)([NH3])[NH3]"])[0]
    assert cis.value is not None and cis.status == "out_of_domain" and "unseen in training" in cis.reason, cis
    assert "->" in cis.prepared


def t_tokenizer_errors_quote_the_users_input(tmp_path):
    """An input whose RDKit canonical form the tokenizer cannot read is an error that quotes the input as
    typed first, the canonical form only as context (a stand-in canonical form with '~' plays RDKit)."""
    _need_rdkit()
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    with mock.patch.object(pr, "prepare_smiles", lambda smiles, keep: ("C~C", False)):
        res = pred.predict_detailed(["C(C)C"])[0]
    assert res.status == "error" and "'C(C)C'" in res.reason, res.reason
    assert res.reason.index("'C(C)C'") < res.reason.index("'C~C'"), res.reason


def t_formula_amounts_are_kept_exactly(tmp_path):
    path, *_ = _tiny_predictor(str(tmp_path), "formula", ("Mg2Si1", "Fe2O3", "Na1Cl1", "Ca1F6Ti1"),
                               extra={"formula_style": "alphabetical_explicit"})
    big, fine = pr.load_predictor(path).predict_detailed(["Fe1000000O", "Fe0.1234567O"])
    assert big.value is not None and big.reason.endswith("read as Fe1000000O1"), big
    assert fine.reason.endswith("read as Fe0.1234567O1") and "0.123457" not in fine.reason, fine
    assert formulas.formula_explicit("Ca3(PO4)2") == "Ca3O8P2" and formulas.formula_explicit("Fe2.0O3") == "Fe2O3"
    assert formulas.formula_explicit("(Fe0.5)3OFe0.25") == "Fe1.75O1"


# ---------------------------------------------------------------------------
# item 10: predict takes a list of strings
# ---------------------------------------------------------------------------

def t_predict_takes_a_list_of_strings(tmp_path):
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    with pytest.raises(TypeError, match="single str 'CCO'"):
        pred.predict("CCO")
    with pytest.raises(TypeError) as e:
        pred.predict_detailed([5, b"CCO", "CCO", None])
    assert all(f in str(e.value) for f in ("item 0 is int 5", "item 1 is bytes b'CCO'", "item 3 is NoneType"))
    assert "item 2" not in str(e.value)
    assert len(pred.predict(("CCO", "CCO", "c1ccccc1O"))) == 3 and pred.predict([]) == []


# ---------------------------------------------------------------------------
# item 12: a tab or a newline in an input never splits its output row
# ---------------------------------------------------------------------------

def t_tabs_and_newlines_stay_inside_their_field(tmp_path):
    model, *_ = _tiny_predictor(str(tmp_path))
    inputs = ["CCO", "C\tC", "C\nC", 'C"C', "C\rC"]
    rc, out, err = _predict(model, *inputs)
    assert rc == 0, err
    body = out[out.index("\ninput\t") + 1:]                        # after the '#' lines (one fact each)
    rows = list(csv.reader(io.StringIO(body, newline=""), delimiter="\t"))
    assert [r[0] for r in rows] == ["input"] + inputs and all(len(r) == 8 for r in rows), rows
    assert [r[5] for r in rows[1:]] == ["unchecked", "error", "error", "error", "error"]
    src = _write_csv(tmp_path / "in.csv", [[f"n{i}", s] for i, s in enumerate(inputs)] + [["x,\ty", "CCO"]],
                     quoting=csv.QUOTE_ALL)                    # Python's writer leaves a lone \r unquoted
    out_path = tmp_path / "out.csv"
    rc, _, err = _predict(model, "--csv", str(src), "--out", str(out_path))
    assert rc == 0, err
    with open(out_path, encoding="utf-8", newline="") as f:
        back = list(csv.reader(f))
    assert [r[1] for r in back[1:]] == inputs + ["CCO"] and back[-1][0] == "x,\ty" and all(len(r) == 9 for r in back)


# ---------------------------------------------------------------------------
# item 14: DeepChem's pickled cache lives with the data, never in the checkout when the data are elsewhere
# ---------------------------------------------------------------------------

def t_deepchem_cache_follows_the_data_folder(tmp_path):
    import types
    pc = _property_common()
    seen = {}

    def loader(**kwargs):
        seen.update(kwargs)
        return ["measured log solubility in mols per litre"], ("dataset",), []
    with open(tmp_path / "delaney-processed.csv", "w") as f:
        f.write("smiles,measured log solubility in mols per litre\nCCO,1.1\n")
    fake = types.SimpleNamespace(molnet=types.SimpleNamespace(load_delaney=loader))
    with mock.patch.object(pc, "deepchem_available", lambda: (True, "9.9")), \
            mock.patch.dict(sys.modules, {"deepchem": fake}), \
            mock.patch.dict(os.environ, {"CHEMDATA_DIR": str(tmp_path)}):
        ok, _, _, _ = pc.deepchem_molnet("load_delaney")
    digest = chemdata.sha256_of(str(tmp_path / "delaney-processed.csv"))[:12]
    assert ok and seen["data_dir"] == str(tmp_path)
    assert seen["save_dir"] == os.path.join(str(tmp_path), "deepchem_save", digest), seen
    assert not seen["save_dir"].startswith(ROOT + os.sep)


# ---------------------------------------------------------------------------
# item 15: argument mistakes are named usage errors; the exit status says whether anything was predicted
# ---------------------------------------------------------------------------

def t_cli_argument_errors_and_exit_status(tmp_path):
    model, *_ = _tiny_predictor(str(tmp_path))
    for flag, value, words in (("--random-smiles", "-1", "must be >= 0"), ("--max-input-tokens", "0", "must be >= 1"),
                               ("--workers", "0", "must be >= 1"), ("--workers", "two", "must be an integer")):
        rc, out, err = _predict(model, "CCO", flag, value)
        assert rc == 2 and flag in err and words in err and "cannot load" not in err and out == "", (flag, err)
    rc, out, _ = _predict(model, "CCO", "--random-smiles", "2", "OCC")            # inputs after an option
    assert rc == 0 and [line.split("\t")[0] for line in _table(out)[1:]] == ["CCO", "OCC"], out
    assert _predict(model, "C%%", "")[0] == 1                                     # every input an error
    assert _predict(model, "C%%", "CCO")[0] == 0                                  # one predicted
    bad = _write_csv(tmp_path / "bad.csv", [["a", "C%%"], ["b", ""]])
    rc, _, err = _predict(model, "--csv", str(bad), "--out", str(tmp_path / "o.csv"))
    assert rc == 1 and "'error': 2" in err, err
    assert _predict(model, "CCO", "--out", str(tmp_path / "o2.csv"))[0] == 2       # --out needs --csv
    rc, help_text, _ = _predict("--help")
    for words in ("exit status", "0 when at least one input was predicted", "--resume", ".partial", "quot"):
        assert words in help_text, words


# ---------------------------------------------------------------------------
# item 9: large files: bounded reading, progress, each distinct input once, parallel = serial
# ---------------------------------------------------------------------------

def t_binary_or_nul_files_are_refused_at_once(tmp_path):
    """A 256 MiB file of NUL bytes (sparse) is refused within a second, naming the file and the offset; so
    is a CSV with a NUL further on, and a line over MAX_LINE_BYTES; nothing is predicted."""
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    nul = tmp_path / "zeros.csv"
    with open(nul, "wb") as f:
        f.truncate(256 * 2 ** 20)
    t0 = time.perf_counter()
    with pytest.raises(chemdata.DatasetFormatError) as e:
        pf.predict_csv(pred, str(nul), "smiles")
    assert time.perf_counter() - t0 < 1.0 and str(nul) in str(e.value) and "byte offset 0" in str(e.value)
    late = tmp_path / "late.csv"
    late.write_bytes(b"name,smiles\na,CCO\nb,CC\0O\n")
    with pytest.raises(chemdata.DatasetFormatError, match=r"NUL byte at byte offset 22 \(line 3\)"):
        pf.predict_csv(pred, str(late), "smiles")
    long = tmp_path / "long.csv"
    long.write_bytes(b"name,smiles\n" + b"a," + b"C" * (pf.MAX_LINE_BYTES + 10) + b"\nb,CCO\n")
    with pytest.raises(chemdata.DatasetFormatError, match=r"line 2 \(from byte offset 12\) is longer than"):
        pf.predict_csv(pred, str(long), "smiles")
    rc, out, err = _predict(pred.path, "--csv", str(nul))
    assert rc == 2 and out == "" and "NUL byte at byte offset 0" in err, err


def t_scan_counts_lines_across_its_pieces(tmp_path):
    """The streamed scan names the right line when the first non-UTF-8 byte, or a UTF-8 character, sits
    across its 1 MiB pieces, and reads the records back as written."""
    body = "smiles\n" + "CCO\n" * 300_000                                # 1.2 MB: two pieces
    path = tmp_path / "latin.csv"
    path.write_bytes(body.encode() + b"\xe9\nCCN\n")
    encoding, note = pf._scan_csv(str(path))
    assert encoding == "latin-1" and "(line 300002 first)" in note, note
    head = "smiles\n" + "CCO\n" * 262_000 + "C" * 568                    # 2**20 - 1 bytes: an '\xe9'
    utf8 = tmp_path / "utf8.csv"                                          # (2 bytes) lies on the cut
    utf8.write_bytes((head + "\xe9\nCCN\n").encode())
    assert len(head.encode()) == 2 ** 20 - 1 and pf._scan_csv(str(utf8)) == ("utf-8-sig", "")
    rows = [r[1] for r in pf._csv_records(str(utf8), "utf-8-sig")]
    assert len(rows) == 262_003 and rows[-2:] == [["C" * 568 + "\xe9"], ["CCN"]]


def _slow_model(folder, n_layers, d_model):
    """An untrained encoder big enough that a few hundred inputs take seconds (the interrupt tests need a
    run still going when they signal it); no domain reference, so only the model's time counts."""
    import transformer
    vocab = chemdata.Vocab.build([["C", "O", "(", ")", "1", "="]])
    model = transformer.TransformerEncoder(len(vocab), d_model=d_model, n_heads=4, n_layers=n_layers, max_len=128,
                                           pad_id=vocab.pad_id, seed=0)
    meta = {"tokenizer": "smiles_atom", "vocab_tokens": vocab.tokens, "target_mean": -2.0, "target_std": 1.5,
            "units": "u", "task": "toy", "max_tokens": None}
    path = os.path.join(folder, "slow.json")
    transformer.save_model(model, path, meta)
    return path


def _many_rows(n_distinct):
    """Distinct alcohol/ether SMILES, every fourth row a repeat of an earlier one, and a few bad rows."""
    distinct = [f"{'C' * (1 + i % 40)}O{'C' * (i // 40)}" for i in range(n_distinct)]
    rows = []
    for i, s in enumerate(distinct):
        rows.append([f"m{i}", s])
        if i % 3 == 2:
            rows.append([f"r{i}", distinct[i // 2]])
    rows[5:5] = [["bad", "C%%"], ["empty", ""]]
    return rows


def t_each_distinct_input_is_predicted_once_and_parallel_equals_serial(tmp_path):
    model, *_ = _tiny_predictor(str(tmp_path))
    pred = pr.load_predictor(model)
    rows = _many_rows(120)
    src = _write_csv(tmp_path / "in.csv", rows)
    calls = []
    real = pred._one
    with mock.patch.object(pred, "_one", side_effect=lambda text: calls.append(text) or real(text)):
        serial, counts, _ = pf.predict_csv(pred, str(src), "smiles")                # workers=1
    assert sorted(calls) == sorted({r[1] for r in rows}), "each distinct input predicted once"
    assert len(calls) < len(rows) - 30 and sum(counts.values()) == len(rows)
    assert [r[:2] for r in csv.reader(io.StringIO(serial))][1:] == rows                  # in input order
    parallel, counts2, _ = pf.predict_csv(pred, str(src), "smiles", workers=2)
    assert parallel == serial and counts2 == counts
    inputs = [r[1] for r in rows]
    assert pred.predict_detailed(inputs, workers=2) == pred.predict_detailed(inputs, workers=1)


def t_progress_with_an_eta_past_200_rows(tmp_path):
    model, *_ = _tiny_predictor(str(tmp_path))
    small = _write_csv(tmp_path / "small.csv", [[f"m{i}", "C" * (1 + i % 30) + "O"] for i in range(150)])
    big = _write_csv(tmp_path / "big.csv", [[f"m{i}", "C" * (1 + i % 30) + "O" + "C" * (i // 30)]
                                             for i in range(260)])
    rc, _, err = _predict(model, "--csv", str(small), "--out", str(tmp_path / "s.csv"))
    assert rc == 0 and "ETA" not in err, err
    rc, _, err = _predict(model, "--csv", str(big), "--out", str(tmp_path / "b.csv"))
    lines = [line for line in err.splitlines() if "ETA" in line]
    assert rc == 0 and lines and lines[-1].startswith("predict: 260/260 rows (100%)"), err


# ---------------------------------------------------------------------------
# item 9 and the brief's "done means": an interrupted run keeps its rows; the printed command finishes it
# ---------------------------------------------------------------------------

_PACED = """import runpy, sys, time, predictor, predict_files
predict_files.CHUNK_SECONDS = 0.1
plain = predictor.Predictor._outcome
predictor.Predictor._outcome = lambda self, text: (time.sleep(0.01), plain(self, text))[1]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""``python predict_files.py ARGV`` paced: 10 ms more per input and chunks of about 0.1 s, so that a run of a few
hundred inputs is still going when the signal comes, however fast the host (the signal handling is the
command's own)."""


def _interrupt(argv, signum):
    """Start ``python predict_files.py ARGV`` (paced), send ``signum`` once a progress line says some rows are
    written, and return (exit status, stderr).  The child gets the default SIGINT action even when this process
    ignores SIGINT (a run started in the background with nohup or &), as a terminal's Ctrl-C would."""
    proc = subprocess.Popen([sys.executable, "-c", _PACED, SCRIPT, *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, CHEMDATA_OFFLINE="1"),
                            preexec_fn=_default_sigint)
    err = ""
    for line in proc.stderr:                               # the first progress line: a chunk is written
        err += line
        if " rows (" in line:
            break
    proc.send_signal(signum)
    err += proc.stderr.read()
    return proc.wait(timeout=120), err


def _kept_rows(partial, reference, err):
    """The rows an interrupted run reports and keeps: its partial file is a prefix of the uninterrupted
    output, and holds the header and exactly the rows the message counts."""
    kept = partial.read_text(encoding="utf-8")
    done = int(re.search(r"after (\d+) of (\d+) rows", err).group(1))
    assert 0 < done and reference.startswith(kept) and len(kept.splitlines()) == done + 1, err
    command = err.strip().splitlines()[-1].strip()
    assert command.endswith("--resume") or "--resume " in command, command
    argv = shlex.split(command)
    assert argv[:2] == ["python", SCRIPT], argv
    return kept, argv[2:]


def t_interrupted_run_keeps_its_rows_and_the_printed_command_finishes_it(tmp_path):
    """Ctrl-C keeps every written row in out.csv.partial and prints the command that finishes the run; a
    run without --resume refuses to replace it; the printed command, itself stopped by SIGTERM (after
    dropping a row cut short, as by kill -9), prints its own; that one finishes with output identical to
    an uninterrupted run, and leaves nothing else behind."""
    model = _slow_model(str(tmp_path), n_layers=1, d_model=16)
    rows = _many_rows(300)
    src = _write_csv(tmp_path / "in.csv", rows)
    reference = pf.predict_csv(pr.load_predictor(model), str(src), "smiles")[0]
    out, partial = tmp_path / "out.csv", tmp_path / "out.csv.partial"
    rc, err = _interrupt([model, "--csv", str(src), "--out", str(out)], signal.SIGINT)
    assert rc == 130 and "interrupted by SIGINT" in err and not out.exists(), err
    kept, argv = _kept_rows(partial, reference, err)
    assert len(kept.splitlines()) < len(rows)
    with open(partial, "ab") as f:                                  # a kill -9 in the middle of a row
        f.write(reference[len(kept):len(kept) + 7].encode())
    rc, _, err = _predict(model, "--csv", str(src), "--out", str(out))                     # no --resume
    assert rc == 2 and "--resume" in err and len(partial.read_bytes()) == len(kept.encode()) + 7, err
    rc, err = _interrupt(argv, signal.SIGTERM)
    assert rc == 143 and "dropped (a row cut short)" in err and "interrupted by SIGTERM" in err, err
    kept2, argv2 = _kept_rows(partial, reference, err)
    assert len(kept2) > len(kept) and not out.exists()
    rc, _, err = _predict(*argv2)
    assert rc == 0 and out.read_text(encoding="utf-8") == reference, err                  # identical
    assert sorted(os.listdir(tmp_path)) == ["in.csv", "out.csv", "slow.json"]


def t_a_stop_whose_exception_was_lost_still_stops_the_run(tmp_path):
    """A signal that lands while parallel_map forks raises inside an at-fork hook, where Python only
    prints the exception: the recorded signal still stops the run after the chunk in progress, with that
    chunk's rows kept."""
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    src = _write_csv(tmp_path / "in.csv", _many_rows(200))
    out = tmp_path / "out.csv"
    with pf._stop_on_signals():
        pf._STOP_SIGNALS.append(signal.SIGTERM)           # the handler ran; its exception went nowhere
        with pytest.raises(pf.PredictInterrupted) as e:
            pf.predict_csv(pred, str(src), "smiles", str(out), workers=2)
    kept = (tmp_path / "out.csv.partial").read_text().splitlines()
    assert e.value.signal_name == "SIGTERM" and 0 < e.value.rows_done == len(kept) - 1 < 200
    assert not out.exists() and pf._STOP_SIGNALS == []


def t_a_stop_after_the_last_row_waits_for_the_rename_and_says_the_output_is_complete(tmp_path):
    """A SIGTERM that comes after every row is written, while <out>.partial is renamed over the output,
    waits for the rename: the output is whole, no partial file or run record is left, and the run reports
    the output complete rather than a resume that has nothing to do."""
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    src = _write_csv(tmp_path / "in.csv", _many_rows(20))
    reference = pf.predict_csv(pred, str(src), "smiles")[0]
    out, finish = tmp_path / "out.csv", safe_io.PartialFile.finish

    def finish_signalled(self):
        os.kill(os.getpid(), signal.SIGTERM)               # lands while the rename is under way
        return finish(self)
    with pf._stop_on_signals(), mock.patch.object(safe_io.PartialFile, "finish", finish_signalled):
        with pytest.raises(pf.PredictInterrupted) as e:
            pf.predict_csv(pred, str(src), "smiles", str(out))
    assert e.value.signal_name == "SIGTERM" and e.value.partial is None and e.value.complete == str(out)
    assert e.value.rows_done == e.value.total == len(_many_rows(20))
    assert out.read_text(encoding="utf-8") == reference
    assert not [n for n in os.listdir(tmp_path) if ".partial" in n]


def t_resume_checks_input_model_and_options(tmp_path):
    model = _slow_model(str(tmp_path), n_layers=1, d_model=8)
    src = _write_csv(tmp_path / "in.csv", _many_rows(30))
    out = str(tmp_path / "out.csv")
    header = b"name,smiles,prediction_u,low,high,spread,status,domain,reason\n"
    with open(out + ".partial", "wb") as f:                                    # an interrupted run's leftovers
        f.write(header)
    pred = pr.load_predictor(model)
    with open(out + ".partial.json", "w") as f:
        json.dump({"input_sha256": chemdata.sha256_of(str(src)), "model_sha256": chemdata.sha256_of(model),
                   "column": "smiles", "max_input_tokens": 400, "n_random": 0,
                   "written": {"bytes": len(header), "sha256": hashlib.sha256(header).hexdigest()}}, f)
    rc, _, err = _predict(model, "--csv", str(src), "--out", out, "--resume", "--random-smiles", "2")
    assert rc == 2 and "n_random" in err, err
    other = _write_csv(tmp_path / "other.csv", _many_rows(31))
    rc, _, err = _predict(model, "--csv", str(other), "--out", out, "--resume")
    assert rc == 2 and "input_sha256" in err, err
    rc, _, err = _predict(model, "--csv", str(src), "--out", out, "--resume")
    assert rc == 0 and "0 finished rows checked" in err, err
    assert open(out).read() == pf.predict_csv(pred, str(src), "smiles")[0]
    rc, _, err = _predict(model, "--csv", str(src), "--out", out, "--resume")
    assert rc == 2 and "no interrupted run" in err, err


# ---------------------------------------------------------------------------
# one writer per output, a file still being written, write errors, tampered rows, an early Ctrl-C
# ---------------------------------------------------------------------------

_RACE = """import os, runpy, sys, time, predictor, predict_files
predict_files.CHUNK_SECONDS = 0.05
outcome, predict_csv, done = predictor.Predictor._outcome, predict_files.predict_csv, []
def held(self, text):
    done.append(text)
    while len(done) > 8 and not os.path.exists(os.environ["RACE_RELEASE"]):
        time.sleep(0.005)
    return outcome(self, text)
predictor.Predictor._outcome = held
def released_together(*args, **kw):
    open(os.environ["RACE_READY"] + "." + str(os.getpid()), "w").close()
    while not os.path.exists(os.environ["RACE_GO"]):
        time.sleep(0.0005)
    return predict_csv(*args, **kw)
predict_files.predict_csv = released_together
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""``python predict_files.py ARGV`` whose predict_csv waits, once the model is loaded, for $RACE_GO to exist (it
says it is ready by creating $RACE_READY.<pid>), so that two such runs start their work at one instant, and
that, after its first 8 inputs (a chunk is written), waits for $RACE_RELEASE: a writer that is surely still
running while the other run tries (--workers 1: the inputs are predicted in this process)."""


def _started_predict(argv, env_extra):
    return subprocess.Popen([sys.executable, "-c", _RACE, SCRIPT, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, CHEMDATA_OFFLINE="1", **env_extra))


def _first_to_end(procs, seconds=20):
    """Wait until one of ``procs`` has ended (at most ``seconds``: two writers that both wait never do)."""
    t0 = time.time()
    while all(p.poll() is None for p in procs) and time.time() - t0 < seconds:
        time.sleep(0.01)


def t_two_runs_on_one_output_one_writes_the_other_is_refused_naming_it(tmp_path):
    """Two ``predict --csv ... --out`` runs on one output, released at one instant: exactly one writes it
    (identical to a single run's output, every row well-formed), the other is refused at once (exit 2)
    naming the writer's pid and command; a --resume or a fresh run while a writer lives is refused the
    same way (both used to write the same out.csv.partial, the rows of one run over the other's)."""
    model = _slow_model(str(tmp_path), n_layers=1, d_model=8)
    src = _write_csv(tmp_path / "in.csv", _many_rows(40))
    reference = pf.predict_csv(pr.load_predictor(model), str(src), "smiles")[0]
    out, go, release = str(tmp_path / "out.csv"), str(tmp_path / "go"), str(tmp_path / "release")
    env = {"RACE_READY": str(tmp_path / "ready"), "RACE_GO": go, "RACE_RELEASE": release}
    argv = [model, "--csv", str(src), "--out", out, "--workers", "1"]
    procs = [_started_predict(argv, env) for _ in range(2)]
    t0 = time.time()
    while len([n for n in os.listdir(tmp_path) if n.startswith("ready.")]) < 2 and time.time() - t0 < 60:
        time.sleep(0.01)
    open(go, "w").close()
    _first_to_end(procs)
    open(release, "w").close()
    results = [(p.pid, p.wait(timeout=120), p.communicate()[1]) for p in procs]
    (winner, rc0, _), (loser, rc1, err) = sorted(results, key=lambda r: r[1])
    assert (rc0, rc1) == (0, 2) and f"pid {winner}" in err and "predict_files.py" in err, results
    assert len(err.strip().splitlines()) == 2 and "being written by" in err, err      # the context line, then it
    assert open(out, encoding="utf-8").read() == reference
    assert sorted(os.listdir(tmp_path)) == sorted(["go", "in.csv", "out.csv", "ready." + str(procs[0].pid), "release",
                                                   "ready." + str(procs[1].pid), "slow.json"])
    os.unlink(out)
    os.unlink(release)
    writer = _started_predict(argv, env)                                    # go exists: it starts at once
    partial = tmp_path / "out.csv.partial"
    t0 = time.time()
    while (not partial.exists() or partial.read_text().count("\n") < 2) and time.time() - t0 < 60:
        time.sleep(0.01)
    for extra in (["--resume"], []):
        rc, _, err = _predict(*argv, *extra)
        assert rc == 2 and f"pid {writer.pid}" in err and "being written by" in err, err
    open(release, "w").close()
    assert writer.wait(timeout=120) == 0, writer.communicate()[1]
    assert open(out, encoding="utf-8").read() == reference


def t_a_csv_still_being_written_predicts_only_whole_lines_it_held_at_the_start(tmp_path):
    """A CSV whose writer is still appending: the rows are counted when the file is scanned and only those
    bytes are read; the last line, cut off mid-write ('CC' of 'CCO', no newline yet), gets status error and no
    value instead of a prediction for ethane; the growth is reported and the progress never passes the
    count (it showed 3021/3020 rows)."""
    model, *_ = _tiny_predictor(str(tmp_path))
    rows = [[f"m{i}", "C" * (1 + i % 30) + "O"] for i in range(240)]
    src = tmp_path / "in.csv"
    _write_csv(src, rows)
    with open(src, "a", encoding="utf-8") as f:
        f.write("cut,CC")                                          # the writer is in the middle of 'cut,CCO\n'
    out, release = tmp_path / "out.csv", str(tmp_path / "release")
    open(tmp_path / "go", "w").close()
    proc = _started_predict([model, "--csv", str(src), "--out", str(out), "--workers", "1"],
                            {"RACE_READY": str(tmp_path / "ready"), "RACE_GO": str(tmp_path / "go"),
                             "RACE_RELEASE": release})                # holds after 8 inputs: it has read them
    partial = tmp_path / "out.csv.partial"
    t0 = time.time()
    while not partial.exists() and proc.poll() is None and time.time() - t0 < 60:
        time.sleep(0.005)
    with open(src, "a", encoding="utf-8") as f:                     # it goes on writing
        f.write("O\nlater,CCCl\n")
    open(release, "w").close()
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0, err
    with open(out, encoding="utf-8") as f:
        written = list(csv.reader(f))
    assert len(written) == 1 + 241 and all(len(r) == 9 for r in written)
    assert written[-1][:2] == ["cut", "CC"] and written[-1][2] == "" and written[-1][6] == "error", written[-1]
    assert "cut off" in written[-1][8] and "line 242" in written[-1][8]
    assert "changed size while it was read" in err and "241 rows" in err, err
    counts = [tuple(map(int, m)) for m in re.findall(r"predict: (\d+)/(\d+) rows", err)]
    assert counts and all(done <= total == 241 for done, total in counts), counts


def _fsize_limit(limit):
    """preexec_fn: files this process writes may not grow past ``limit`` bytes (ulimit -f), as on a full
    disk; a write past it fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def t_a_failed_write_is_one_line_exit_2_and_keeps_the_rows_with_the_command_that_finishes(tmp_path):
    """Standard output that cannot be written (a file size limit; a full device) in inputs mode and with
    --csv: one line 'predict: cannot write ...' and exit 2 (a traceback and exit 1 before).  --out on a disk
    that fills up: the finished rows stay in OUT.partial and the message gives the command that finishes
    the run; that command, once there is room, gives the uninterrupted output."""
    model, *_ = _tiny_predictor(str(tmp_path))
    src = _write_csv(tmp_path / "in.csv", _many_rows(120))
    reference = pf.predict_csv(pr.load_predictor(model), str(src), "smiles")[0]
    sinks = [("limit", _fsize_limit(0), str(tmp_path / "stdout.txt"), "File too large")]
    device, is_device = _special_files(str(tmp_path))["device"]
    if is_device is stat.S_ISCHR:
        sinks.append(("full", None, device, "No space left on device"))
    for name, limit, path, why in sinks:
        for argv in ([model, "CCO", "C%%"], [model, "--csv", str(src)]):
            with open(path, "wb") as stdout:
                proc = subprocess.run([sys.executable, SCRIPT, *argv], stdout=stdout,
                                      stderr=subprocess.PIPE, text=True, preexec_fn=limit, timeout=120,
                                      env=dict(os.environ, CHEMDATA_OFFLINE="1"))
            last = proc.stderr.strip().splitlines()[-1]
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, (name, argv, proc.stderr)
            assert last.startswith("predict: cannot write") and "standard output" in last and why in last, last
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, SCRIPT, model, "--csv", str(src), "--out", str(out),
                           "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_fsize_limit(3000), timeout=120, env=dict(os.environ, CHEMDATA_OFFLINE="1"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "File too large" in proc.stderr and "finished rows are kept" in proc.stderr, proc.stderr
    command = shlex.split(proc.stderr.strip().splitlines()[-1])
    assert command[:2] == ["python", SCRIPT] and "--resume" in command, command
    kept = (tmp_path / "out.csv.partial").read_text(encoding="utf-8")
    assert kept.count("\n") > 1 and reference.startswith(kept[:kept.rindex("\n") + 1]) and not out.exists()
    rc, _, err = _predict(*command[2:])
    assert rc == 0 and out.read_text(encoding="utf-8") == reference, err


def t_resume_refuses_rows_edited_since_they_were_written(tmp_path):
    """--resume keeps an interrupted run's rows only if they are the bytes it wrote: OUT.partial.json records
    the size and sha256 of what was written after every chunk, so a prediction edited inside OUT.partial
    (the columns the input check cannot see) is refused, naming the file; the untouched file resumes."""
    pred = pr.load_predictor(_tiny_predictor(str(tmp_path))[0])
    src = _write_csv(tmp_path / "in.csv", _many_rows(200))
    reference = pf.predict_csv(pred, str(src), "smiles")[0]
    out, partial = tmp_path / "out.csv", tmp_path / "out.csv.partial"
    with pf._stop_on_signals():
        pf._STOP_SIGNALS.append(signal.SIGTERM)                    # stops after the first chunk
        with pytest.raises(pf.PredictInterrupted):
            pf.predict_csv(pred, str(src), "smiles", str(out), workers=2)
    honest = partial.read_bytes()
    line = honest.split(b"\n")[1]
    value = line.split(b",")[2]
    assert value and float(value)
    partial.write_bytes(honest.replace(line, line.replace(value, b"%.6g" % (float(value) + 3.0)), 1))
    with pytest.raises(chemdata.DatasetFormatError, match="was changed after") as e:
        pf.predict_csv(pred, str(src), "smiles", str(out), resume=True)
    assert str(partial) in str(e.value) and not out.exists()
    partial.write_bytes(honest)
    assert pf.predict_csv(pred, str(src), "smiles", str(out), resume=True)[0] == str(out)
    assert out.read_text(encoding="utf-8") == reference


_CTRL_C_DURING_IMPORT = """import os, runpy, signal, sys
target = sys.argv[1]
class CtrlC:                        # a real SIGINT, sent while the module target is being imported
    def find_spec(self, name, path=None, module=None):
        if name == target:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlC())
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def t_ctrl_c_while_the_command_starts_is_one_line_and_exit_130(tmp_path):
    """A Ctrl-C in the first tenth of a second, while predict_files.py imports its modules (its own, the
    predictor's, transformer's), is one line and exit status 130, not an import traceback."""
    model, *_ = _tiny_predictor(str(tmp_path))
    for module in ("chemdata", "predict_files", "transformer"):
        proc = subprocess.run([sys.executable, "-c", _CTRL_C_DURING_IMPORT, module, SCRIPT, model, "CCO"],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, CHEMDATA_OFFLINE="1"),
                              preexec_fn=_default_sigint)     # a background test run ignores SIGINT; the child must not
        assert proc.returncode == 130 and "Traceback" not in proc.stderr, (module, proc.returncode, proc.stderr)
        assert (proc.stderr.strip() == "predict_files.py: interrupted (Ctrl-C)"
                and proc.stdout == ""), (module, proc.stderr)


# ---------------------------------------------------------------------------
# experiments 6-8: predictors, the predict command, property helpers
# ---------------------------------------------------------------------------

def _tiny_predictor(folder, tokenizer="smiles_atom", items=("CCO", "c1ccccc1O", "CCCl", "CC(=O)O"),
                    ys=(-0.2, -0.7, -1.1, 0.9), extra=None, seed=0):
    """Train a tiny TransformerEncoder (initialised from ``seed``) for a few steps and save it with predictor
    meta; returns (path, model, vocab, scaler)."""
    import transformer
    tok = pr.PREDICTOR_TOKENIZERS[tokenizer]
    vocab = chemdata.Vocab.build([tok(s) for s in items])
    scaler = evaluation.ZScore().fit(ys)
    model = transformer.TransformerEncoder(len(vocab), d_model=8, n_heads=2, n_layers=1, max_len=64,
                                           pad_id=vocab.pad_id, seed=seed)
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
        pred = pr.load_predictor(path)
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
        _raises(pr.PredictorFormatError, pr.load_predictor, bad)


def _table(out):
    """The predict command's output without its '#' lines (one fact each): the header row, then one row per input."""
    return [line for line in out.splitlines() if not line.startswith("#")]


def t_predict_command_line_and_csv_keep_every_row():
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        proc = subprocess.run([sys.executable, SCRIPT, path, "CCO", "c1ccccc1O", "C%%"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("# model ") and all(x.startswith("# ") and len(x) <= 200
                                                         for x in proc.stdout.splitlines() if x.startswith("#"))
        lines = [proc.stdout.splitlines()[0]] + _table(proc.stdout)     # the first fact, then the table
        assert len(lines) == 5 and lines[0].startswith("# model ") and lines[1].split("\t") == [
            "input", "prediction_u", "low", "high", "spread", "status", "domain", "reason"]
        assert lines[2].split("\t")[0] == "CCO" and lines[4].split("\t")[1:6] == ["", "", "", "", "error"]
        float(lines[2].split("\t")[1])
        src, out = os.path.join(folder, "in.csv"), os.path.join(folder, "out.csv")
        with open(src, "w") as f:
            f.write("name,smiles\na,CCO\nb,C%%\nc\nd,c1ccccc1O\ne,\n")
        proc = subprocess.run([sys.executable, SCRIPT, path, "--csv", src, "--column", "smiles",
                               "--out", out], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        with open(out) as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["name", "smiles", "prediction_u", "low", "high", "spread", "status", "domain",
                           "reason"] and len(rows) == 6
        assert [r[0] for r in rows[1:]] == ["a", "b", "c", "d", "e"]
        assert rows[1][-3] == "unchecked" and float(rows[1][-7]) and rows[4][-3] == "unchecked"
        assert rows[1][-6:-3] == ["", "", ""]                          # a plain file: no interval, no spread
        assert rows[2][-7:-2] == ["", "", "", "", "error"] and rows[3][-7:-2] == ["", "", "", "", "error"]
        assert "line 4" in rows[3][-1]
        proc = subprocess.run([sys.executable, SCRIPT, path, "--csv", src, "--column", "nope"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "nope" in proc.stderr


def t_formula_predictor_reads_formulas_as_in_training():
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder, "formula", ("Mg2Si1", "Fe2O3", "Na1Cl1", "Ca1F6Ti1"),
                                   extra={"formula_style": "alphabetical_explicit"})
        pred = pr.load_predictor(path)
        a, b, c, d = pred.predict_detailed(["Mg2Si1", "SiMg2", "Xx2", "Ca3(PO4)2"])
        assert a.value == b.value and b.reason.endswith("; read as Mg2Si1")
        assert c.status == "error" and "Xx" in c.reason and d.status == "out_of_domain" and d.n_unk


def _property_common():
    """demos/property_common.py, imported as the demos import it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos"))
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
    scaler = evaluation.ZScore().fit(ys)
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
    it was trained on canonical SMILES (what it reads); a model trained on SMILES as a file writes them reads
    RDKit's nitro and biaryl forms in that file's spelling (no <unk>)."""
    _need_rdkit()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pred = pr.load_predictor(os.path.join(root, "models", "esol_transformer.json"))
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
    assert (prep["recorded"] and prep["trained_on_canonical"] is True
            and "trained on canonical SMILES" in pred.describe())
    with tempfile.TemporaryDirectory() as folder:     # a model trained on SMILES as ESOL writes them
        path, *_ = _tiny_predictor(folder, items=("O=N(=O)c1ccccc1", "c1ccc(c2ccccc2)cc1", "CCO", "CC(=O)O"))
        written = pr.load_predictor(path)
        assert written.preparation["trained_on_canonical"] is False
        nitro, biphenyl = written.predict_detailed(["[O-][N+](=O)c1ccccc1", "c1ccc(-c2ccccc2)cc1"])   # RDKit's forms
    assert (nitro.prepared, nitro.n_unk, biphenyl.prepared, biphenyl.n_unk) == (
        "O=N(=O)c1ccccc1", 0, "c1ccc(c2ccccc2)cc1", 0)            # written as that model's data: no <unk>
    assert "-1" in str(_raises(ValueError, pr.Predictor, pred.model, pred.meta, n_random=-1))
    assert "'9'" in str(_raises(TypeError, pr.Predictor, pred.model, pred.meta, max_input_tokens="9"))


def t_predictor_without_rdkit_checks_nothing():
    """Bad input: without RDKit a SMILES is 'unchecked' (validity not checked), never ok."""
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        pred = pr.load_predictor(path)
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
        pred = pr.load_predictor(path)
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
        avg = pr.Predictor(pred.model, pred.meta, path, n_random=3)
        means = avg.predict(["OC(C)CC", "CCC(C)O", "C(C)(O)CC"])
        assert len(set(means)) == 1 and means[0] != pred.predict(["CCC(C)O"])[0]
        assert "3 random SMILES" in avg.predict_detailed(["CCO"])[0].reason and "4 spellings" in avg.describe()
        path2, *_ = _tiny_predictor(folder)
        r = pr.load_predictor(path2).predict_detailed(["CCO"])[0]
        assert (r.status, r.domain) == ("unchecked", "not checked") and pr.NO_REFERENCE in r.reason


def t_predictor_length_limit_answers_at_once():
    """an input over the stated token limit is refused at once (error, reason with the
    limit); the limit can be raised."""
    import time
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        pred = pr.load_predictor(path)
        t0 = time.perf_counter()
        r = pred.predict_detailed(["C" * 5000])[0]
        assert time.perf_counter() - t0 < 2 and r.status == "error" and r.value is None
        assert f"over the input limit of {pr.DEFAULT_MAX_INPUT_TOKENS}" in r.reason
        assert pr.load_predictor(path, max_input_tokens=600).predict(["C" * 500])[0] is not None


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
        out = os.path.join(folder, "out.csv")
        proc = subprocess.run([sys.executable, SCRIPT, path, "--csv", src, "--out", out],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "read as Latin-1" in proc.stderr and "line 3" in proc.stderr and "validation RMSE 0.5" in proc.stderr
        with open(out, encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["name", "smiles", "note", "prediction_log10(mol/L)", "low", "high", "spread", "status",
                           "domain", "reason"]
        assert all(len(r) == 10 for r in rows) and rows[2][0] == "café"
        want = ["ok", "ok", "error", "error", "error", "invalid", "ok", "out_of_domain", "out_of_domain", "error",
                "error", "ok"]                      # a short row is not predicted either (a row cut short)
        assert [r[7] for r in rows[1:]] == want, [r[7:] for r in rows[1:]]
        assert "line 4 has 4 fields" in rows[3][9] and rows[3][3] == "" and "line 5 has 2" in rows[4][9]
        assert rows[4][3] == ""
        assert "line 6 is empty" in rows[5][9] and "stereo ignored" in rows[7][9] and rows[8][8] == "out"
        assert "over the input limit" in rows[10][9] and "line 12: field larger" in rows[11][9]
        missing = os.path.join(folder, "nope", "out.csv")
        proc = subprocess.run([sys.executable, SCRIPT, path, "--csv", src, "--out", missing],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "does not exist" in proc.stderr
        assert not os.path.exists(os.path.dirname(missing))
        _raises(ValueError, pf.predict_csv, pr.load_predictor(path), src, "smiles", src)
        with open(src, "rb") as f:
            assert f.read().startswith(b"\xef\xbb\xbf")          # the input is untouched
        empty = os.path.join(folder, "empty.csv")
        open(empty, "w").close()
        _raises(chemdata.DatasetFormatError, pf.predict_csv, pr.load_predictor(path), empty, "smiles")




def t_predict_command_help_usage_errors_and_console_script(monkeypatch):
    """``pf.main``: --help exits 0 with the usage on stdout, a usage error exits 2 naming it; the
    usage and resume lines name the command as it was started (the console script, or python + the script
    as typed); pyproject.toml's console script is this ``main``; ``python predict_files.py`` runs the real
    module's ``main`` (the one a caller may have adjusted), not its ``__main__`` copy's."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert _raises(SystemExit, pf.main, ["--help"]).code == 0
    assert out.getvalue().startswith("usage: python predict_files.py") and "--csv" in out.getvalue()
    for argv, words in (([], "required: model"), (["m.json"], "either inputs"), (["m.json", "CCO", "--out", "o"],
                        "--out and --resume go with --csv"), (["m.json", "CCO", "--bogus"], "unrecognized")):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            assert _raises(SystemExit, pf.main, argv).code == 2, argv
        assert "usage: python predict_files.py" in err.getvalue() and words in err.getvalue(), (argv, err.getvalue())
    for argv0, words in (("/venv/bin/chem-transformer-predict", ["chem-transformer-predict"]),
                         ("/venv/Scripts/chem-transformer-predict.exe", ["chem-transformer-predict"]),
                         ("../predict_files.py", ["python", "../predict_files.py"]),
                         ("-c", ["python", "predict_files.py"])):
        monkeypatch.setattr(sys, "argv", [argv0])
        assert pf._command_words() == words, (argv0, pf._command_words())
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        scripts = f.read().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^chem-transformer-predict = "predict_files:main"$', scripts, re.M), scripts
    assert pf.COMMAND == "chem-transformer-predict" and callable(pf.main)
    code = ("import runpy, sys, predict_files\n"
            "predict_files.main = lambda argv=None: 7\n"
            "sys.argv = ['predict_files.py', '--help']\n"
            "try:\n    runpy.run_path(predict_files.__file__, run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "7", (proc.stdout, proc.stderr)


def t_chemdata_predict_alias_says_once_where_it_moved_and_runs_the_same_command():
    """``python chemdata.py predict ARGS`` (kept for one release) prints chemdata's one-line note once on stderr,
    then is ``python predict_files.py ARGS``: the same output and exit status, a usage error included."""
    with tempfile.TemporaryDirectory() as folder:
        path, *_ = _tiny_predictor(folder)
        for argv in ([path, "CCO", "C%%"], [path], ["--help"]):
            new, old = (subprocess.run([sys.executable, *command, *argv], capture_output=True, text=True,
                                       timeout=120, cwd=ROOT) for command in (["predict_files.py"],
                                                                              ["chemdata.py", "predict"]))
            assert (old.returncode, old.stdout) == (new.returncode, new.stdout), (argv, old.stdout, new.stdout)
            note, rest = old.stderr.split("\n", 1)
            assert note == chemdata._PREDICT_MOVED and chemdata._PREDICT_MOVED not in rest, old.stderr
            assert "chem-transformer-predict" in note and "next release" in note
            assert rest == new.stderr, (argv, rest, new.stderr)
    assert [new.returncode, old.returncode] == [0, 0]


def t_chemdata_predict_alias_ignores_ctrl_c_and_passes_sigterm_on(tmp_path):
    """While the moved command runs, the alias ignores SIGINT (a terminal's Ctrl-C reaches the child, which
    stops on its own) and passes SIGTERM on to it; it exits with the child's status.  The child here is a
    stand-in predict_files.py beside a copy of chemdata.py."""
    for name in ("chemdata.py", "safe_io.py"):
        shutil.copyfile(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "predict_files.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda s, f: (print('child got SIGTERM', flush=True), sys.exit(143)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[1]))\n"
        "print('child done', flush=True)\n")
    for signum, want, status in ((signal.SIGINT, "child done", 0), (signal.SIGTERM, "child got SIGTERM", 143)):
        proc = subprocess.Popen([sys.executable, "chemdata.py", "predict", "2"], cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signum)                                    # to the alias alone, not to the child
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out.strip()) == (status, want), (signum, proc.returncode, out, err)
        assert err.count("has moved") == 1 and "Traceback" not in err, err


def t_readme_predict_example_is_a_real_run():
    """The README's "Predict a property" output block is what its commands (lines starting "$ ") print today,
    line for line (``chem-transformer-predict`` run as ``python predict_files.py``, its checkout form)."""
    _need_rdkit()
    import shlex
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    marker = "<!-- predict example: tests/tests_predictor.py runs the command and compares every line -->"
    assert marker in text, "the README's predict example lost its marker"
    block = text.split(marker, 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block[0].startswith("$ chem-transformer-predict "), block[0]
    starts = [i for i, line in enumerate(block) if line.startswith("$ ")] + [len(block)]
    for a, b in zip(starts, starts[1:]):
        argv = shlex.split(block[a][2:])
        assert argv[0] == pf.COMMAND, argv
        out = subprocess.run([sys.executable, SCRIPT] + argv[1:], cwd=root, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == block[a + 1:b], f"README differs from a real run of {block[a]}:\n{out.stdout}"


def t_csv_not_utf8_names_the_right_line_after_a_bom():
    """The first non-UTF-8 line is counted in the file as written, BOM or not (the byte right after a newline)."""
    with tempfile.TemporaryDirectory() as d:
        for bom in (b"", b"\xef\xbb\xbf"):
            path = os.path.join(d, "x.csv")
            with open(path, "wb") as f:
                f.write(bom + b"smiles\nCCO\n\xe9\nCCN\n")
            encoding, note = pf._scan_csv(path)
            assert encoding == "latin-1" and "(line 3 first)" in note, (bom, note)
            records = list(importlib.import_module("predict_files")._csv_records(path, encoding))
            assert [r[1] for r in records] == [["smiles"], ["CCO"], ["\xe9"], ["CCN"]], records



# ---------------------------------------------------------------------------
# ensembles, calibrated intervals, measured errors and the skill note (meta blocks written by the demos)
# ---------------------------------------------------------------------------

ERRORS = {"how": "this predictor on the split's molecules",
          "valid": {"n": 10, "rmse": 0.83, "mae": 0.6, "r2": 0.8, "coverage": 0.9, "mean_width": 2.1},
          "test": {"n": 12, "rmse": 0.98, "mae": 0.7, "r2": 0.78, "coverage": None, "mean_width": None}}


def _interval(scale, q=0.7, offset=None):
    """A ``meta['interval']`` block (offset 1 for 'constant', else 0.05 unless given)."""
    return {"level": 0.9, "scale": scale, "q": q, "offset": offset if offset is not None else
            (1.0 if scale == "constant" else 0.05), "n_calibration": 20, "rule": "split conformal on validation"}


def _ensemble_of(folder, paths, name="ens.json", **meta):
    """An ensemble model file: the first file of ``paths`` with the others' weights as members 2..k
    (``meta['ensemble']``) and the meta blocks ``meta`` added; returns its path."""
    objs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            objs.append(json.load(f))
    obj = objs[0]
    obj["meta"]["ensemble"] = {
        "members": [{"seed": i, "epoch": 3, "valid_rmse": 0.5 + i / 10} for i in range(len(objs))],
        "extra_weights": [o["weights"] for o in objs[1:]], "spread": "sample std of the members' values"}
    obj["meta"].update(meta)
    out = os.path.join(folder, name)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return out


def t_finite_but_absurd_meta_is_refused_and_an_interval_needs_the_members_it_was_calibrated_for(tmp_path):
    """Fields that are each finite can still make a derived quantity infinite: interval q = offset = 1e308
    (half-width inf: it gave low -inf, high inf with status ok), target_mean = 1e308 (every value inf),
    target_std = 1e308 (an AttributeError in each row's reason): each refused at load naming the fields.  An
    interval is given only with the member count it was calibrated for (interval.n_members, or for older
    files the seeds of meta.selection): a file stripped of its ensemble block, or --max-members 2, gets no
    interval and says why (it was given the 3-member interval as a 'single model')."""
    members = _seeded_members(str(tmp_path), seeds=(0, 1, 2))
    interval = dict(_interval("constant"), n_members=3)
    good = _ensemble_of(str(tmp_path), members, interval=interval)
    for i, (changes, words) in enumerate([({"interval__q": 1e308, "interval__offset": 1e308}, "meta.interval.q"),
                                          ({"target_mean": 1e308}, "meta.target_mean"),
                                          ({"target_std": 1e308}, "meta.target_std")]):
        bad = _with_meta(str(tmp_path), good, f"absurd{i}.json", **changes)
        e = str(_raises(pr.PredictorFormatError, pr.load_predictor, bad))
        assert bad in e and words in e and ("not finite" in e or "no finite value" in e), e
    assert pr.load_predictor(good).predict_detailed(["CCO"])[0].low is not None
    older = _with_meta(str(tmp_path), good, "older.json", interval=_interval("constant"),
                       selection={"seeds": [0, 1, 2], "rule": "every seed"})
    for path in (good, older):
        stripped = _with_meta(str(tmp_path), path, "stripped.json", ensemble=None)
        for pred in (pr.load_predictor(stripped), pr.load_predictor(path, max_members=2)):
            res = pred.predict_detailed(["CCO"])[0]
            assert res.value is not None and res.low is None and res.high is None, (path, res)
            assert f"no interval (calibrated for an ensemble of 3 models, {len(pred.members)} used" in pred.describe()


def t_a_huge_input_is_refused_in_one_short_line():
    """A formula amount of 100,000 digits is refused in words (not Python's 'Exceeds the limit (4300 digits)'
    advice about sys.set_int_max_str_digits); an unparseable SMILES of a megabyte is quoted by its first 80
    characters and its length, not echoed whole into its reason."""
    with tempfile.TemporaryDirectory() as folder:
        formula_model = _tiny_predictor(folder, "formula", ("Mg2Si1", "Fe2O3", "Na1Cl1", "Ca1F6Ti1"),
                                       extra={"formula_style": "alphabetical_explicit"})[0]
        huge = "Fe" + "9" * 100_000
        e = str(_raises(ValueError, formulas.parse_formula, huge))
        assert "100,000 characters" in e and "at most 50" in e and len(e) < 300, e[:300]
        res = pr.load_predictor(formula_model).predict_detailed([huge])[0]
        assert res.status == "error" and "100,000 characters" in res.reason and len(res.reason) < 300, res.reason[:300]
        os.mkdir(os.path.join(folder, "s"))
        smiles = _tiny_predictor(os.path.join(folder, "s"))[0]
        res = pr.load_predictor(smiles).predict_detailed(["C%" + "C" * 1_000_000])[0]
        assert res.status == "error" and "(1,000,002 characters)" in res.reason and len(res.reason) < 300, \
            res.reason[:300]


def _seeded_members(folder, seeds=(0, 1, 2)):
    """Tiny predictors trained from ``seeds``, each in its own subfolder; their paths."""
    paths = []
    for seed in seeds:
        sub = os.path.join(folder, f"seed{seed}")
        os.mkdir(sub)
        paths.append(_tiny_predictor(sub, seed=seed)[0])
    return paths


def _perturbed_members(folder, path, factors=(1.0, 1.15, 0.8)):
    """Copies of model file ``path`` whose output layer's weights are scaled by ``factors`` (distinct members
    without training); their paths."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    head = [name for name in obj["weights"] if name.startswith("head")]
    paths = []
    for i, factor in enumerate(factors):
        copy = json.loads(json.dumps(obj))
        for name in head:
            w = copy["weights"][name]
            copy["weights"][name] = [[x * factor for x in r] for r in w] if isinstance(w[0], list) else [
                x * factor for x in w]
        paths.append(os.path.join(folder, f"member{i}.json"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            json.dump(copy, f)
    return paths


def t_ensemble_value_is_the_mean_of_its_members_and_spread_their_stdev(tmp_path):
    """An ensemble of 3 tiny models (seeds 0, 1, 2): each input's value is the mean of the members' own
    single-model predictions, spread their sample standard deviation; max_members=1 is member 1 exactly,
    with no spread and no interval (calibrated for the whole ensemble), and says so."""
    import statistics
    members = _seeded_members(str(tmp_path))
    ens_path = _ensemble_of(str(tmp_path), members, interval=_interval("spread"))
    inputs = ["CCO", "CCCl", "c1ccccc1O", "CC[Se]", "C%%"]
    own = [pr.load_predictor(m).predict(inputs) for m in members]
    ens = pr.load_predictor(ens_path)
    assert len(ens.members) == 3 and ens.model is ens.members[0]
    got = ens.predict_detailed(inputs)
    for i, r in enumerate(got[:4]):
        values = [v[i] for v in own]
        assert len(set(values)) == 3, values                                # the members really differ
        assert abs(r.value - sum(values) / 3) < 1e-12 and abs(r.spread - statistics.stdev(values)) < 1e-12
        half = 0.7 * (r.spread + 0.05)
        assert abs(r.low - (r.value - half)) < 1e-12 and abs(r.high - (r.value + half)) < 1e-12
    assert got[4].status == "error" and (got[4].value, got[4].spread, got[4].low, got[4].high) == (None,) * 4
    text = ens.describe()
    assert "mean of 3 models (seeds 0, 1, 2)" in text \
        and "90 % split-conformal interval, scaled by the ensemble spread" in text, text
    one = pr.load_predictor(ens_path, max_members=1)
    first = one.predict_detailed(inputs)
    assert len(one.members) == 1 and [r.value for r in first] == own[0]
    assert all((r.spread, r.low, r.high) == (None, None, None) for r in first)
    assert "single model" in one.describe() and "no interval" in one.describe() and "mean of" not in one.describe()
    two = pr.load_predictor(ens_path, max_members=2).predict(inputs[:1])[0]
    assert abs(two - (own[0][0] + own[1][0]) / 2) < 1e-12
    rc, out, err = _predict(ens_path, "--max-members", "1", "CCO")
    assert rc == 0 and any(x.startswith("# single model") for x in out.splitlines()), err
    assert _table(out)[1].split("\t")[1:5] == [f"{own[0][0]:.4f}", "", "", ""], out
    assert "0" in str(_raises(ValueError, pr.load_predictor, ens_path, max_members=0))


def t_ensemble_parallel_equals_serial(tmp_path):
    """An ensemble file predicted on 2 processes gives the rows one process gives, spread and interval too."""
    members = _seeded_members(str(tmp_path), seeds=(0, 1))
    pred = pr.load_predictor(_ensemble_of(str(tmp_path), members, interval=_interval("spread")))
    rows = _many_rows(40)
    src = _write_csv(tmp_path / "in.csv", rows)
    serial, counts, _ = pf.predict_csv(pred, str(src), "smiles")
    parallel, counts2, _ = pf.predict_csv(pred, str(src), "smiles", workers=2)
    assert parallel == serial and counts2 == counts
    back = list(csv.DictReader(io.StringIO(serial)))
    assert all(r["spread"] and r["low"] and r["high"] for r in back if r["status"] != "error")
    inputs = [r[1] for r in rows]
    assert pred.predict_detailed(inputs, workers=2) == pred.predict_detailed(inputs, workers=1)


def t_interval_is_q_times_scale_plus_offset_for_each_scale(tmp_path):
    """For each scale, low/high = value -/+ q * (u + offset), u = 0, the spread, or 1 - similarity, recomputed
    by hand; no interval where u is unknown (an unparsable SMILES has no similarity)."""
    _need_rdkit()
    base, _ = _domain_predictor(str(tmp_path))
    members = _perturbed_members(str(tmp_path), base)
    inputs = ["CCO", "OCC", "CCCCCCO", "c1ccc2ccccc2c1", "C1CC", "C%%"]
    for kind in ("constant", "spread", "similarity"):
        q, offset = 0.7, (1.0 if kind == "constant" else 0.05)
        pred = pr.load_predictor(_ensemble_of(str(tmp_path), members, f"{kind}.json",
                                              interval=_interval(kind, q, offset)))
        rows = pred.predict_detailed(inputs)
        for r in rows:
            u = {"constant": 0.0, "spread": r.spread,
                 "similarity": None if r.similarity is None else 1 - r.similarity}[kind]
            if r.value is None or u is None:
                assert (r.low, r.high) == (None, None), (kind, r)
                continue
            assert abs(r.low - (r.value - q * (u + offset))) < 1e-12, (kind, r)
            assert abs(r.high - (r.value + q * (u + offset))) < 1e-12, (kind, r)
        with_interval = [r.input for r in rows if r.low is not None]
        assert with_interval == (inputs[:5] if kind != "similarity" else inputs[:4]), (kind, with_interval)
        assert "90 % split-conformal interval" in pred.describe()
    spread = pred.predict_detailed(["CCO"])[0].spread
    assert spread > 0 and pr.interval_scale("spread", spread, 0.4) == spread
    assert pr.interval_scale("similarity", None, 0.25) == 0.75 and pr.interval_scale("constant", None, None) == 0
    assert pr.interval_half_width(_interval("similarity", 2.0, 0.5), None, 0.25) == 2.0 * (0.75 + 0.5)
    assert pr.interval_half_width(_interval("spread"), None, 0.9) is None
    assert "'width'" in str(_raises(ValueError, pr.interval_scale, "width", 1.0, 0.5))


def t_conformal_quantile_is_the_ceil_n_plus_1_level_th_smallest():
    """The split-conformal quantile: the ceil((n + 1) * level)-th smallest score, +inf past n; ties count
    once each; the level is read as the decimal written."""
    cq = pr.conformal_quantile
    assert cq([5, 3, 9, 1, 7, 2, 8, 4, 6], 0.9) == 9                         # n 9: rank ceil(9.0) = 9
    assert cq([5, 3, 1, 4, 2], 0.9) == math.inf                             # n 5: rank ceil(5.4) = 6 > 5
    assert cq([2, 1, 2, 2, 3], 0.5) == 2 and cq([1, 1, 1, 1], 0.6) == 1     # ties: rank 3, rank ceil(3.0) = 3
    assert cq([float(i) for i in range(1, 20)], 0.95) == 19.0               # n 19: rank ceil(19.0) = 19
    assert cq(range(10, 0, -1), 0.7) == 8 and cq([], 0.5) == math.inf       # n 10: rank ceil(7.7) = 8
    assert cq([0.1, 0.3, 0.2], 0.5) == 0.2
    for level in (0, 1, 1.5, "0.9", math.nan):
        assert repr(level) in str(_raises(ValueError, cq, [1.0, 2.0], level))
    assert "nan" in str(_raises(ValueError, cq, [1.0, math.nan], 0.5))


def t_plain_model_file_keeps_working(tmp_path):
    """A model file without ensemble, interval, errors or skill blocks: one model, no spread, no interval
    (empty fields), the validation RMSE as a rough uncertainty, no skill note."""
    path, *_ = _tiny_predictor(str(tmp_path), extra={"valid_rmse": 0.5})
    pred = pr.load_predictor(path)
    assert len(pred.members) == 1 and pred.interval is None
    text = pred.describe()
    assert "validation RMSE 0.5 u (a rough uncertainty)" in text and "single model" in text and "no interval" in text
    assert "no better than" not in text and "seed" not in text
    r = pred.predict_detailed(["CCO"])[0]
    assert r.value is not None and (r.spread, r.low, r.high) == (None, None, None)
    src = _write_csv(tmp_path / "in.csv", [["a", "CCO"], ["b", "CCCl"]])
    rows = list(csv.DictReader(io.StringIO(pf.predict_csv(pred, str(src), "smiles")[0])))
    assert [(r["low"], r["high"], r["spread"]) for r in rows] == [("", "", "")] * 2 and all(
        r["prediction_u"] for r in rows)
    assert ("no better than" not in "".join(r["reason"] for r in rows)
            and "beats predicting" not in "".join(r["reason"] for r in rows))


def t_a_model_no_better_than_the_mean_says_so_on_every_row(tmp_path):
    """The context line states skill.beats_mean (false: "no better than"; true: "beats") with the measured
    errors instead of the rough uncertainty; rows without an in-domain prediction (here: no training
    reference) state no skill and say why, in predict_detailed and in the CSV; errors say neither
    (tests/tests_claims.py checks the in-domain rows of a committed model)."""
    note = "no better than predicting the training mean on test"
    inputs = ["CCO", "CC[Se]", "C%%", "", "C" * 30]
    for beats in (False, True):
        folder = tmp_path / str(beats)
        folder.mkdir()
        path, *_ = _tiny_predictor(str(folder), extra={"valid_rmse": 0.5, "errors": ERRORS, "skill": {
            "beats_mean": beats, "statement": "test RMSE against the training mean's"}})
        pred = pr.load_predictor(path)
        rows = pred.predict_detailed(inputs)
        assert [r.status for r in rows] == ["unchecked", "out_of_domain", "error", "error", "unchecked"]
        # no row here is predicted in the domain (no training reference): none states the skill, each says why
        assert not any(note in r.reason or pr.SKILL_NOTE in r.reason for r in rows), rows
        assert [pr.NO_CLAIM_NOTE in r.reason for r in rows] == [True, True, False, False, True], rows
        src = _write_csv(folder / "in.csv", [[f"m{i}", s] for i, s in enumerate(inputs)])
        back = list(csv.DictReader(io.StringIO(pf.predict_csv(pred, str(src), "smiles")[0])))
        assert [pr.NO_CLAIM_NOTE in r["reason"] for r in back] == [True, True, False, False, True], back
        text = pred.describe()
        assert (note in text) is (not beats) and (pr.SKILL_NOTE in text) is beats, text
        assert "rough uncertainty" not in text
        assert ("validation RMSE 0.83, test RMSE 0.98 u (R\u00b2 0.78), measured through this predictor on the "
                "split's molecules") in text, text
    assert rows[0].reason.endswith("domain not checked (model file has no training reference); "
                                   + pr.NO_CLAIM_NOTE + " (the applicability domain could not be checked)")


def t_ensemble_and_interval_blocks_are_checked_at_load(tmp_path):
    """A wrong member count, a bad member record, weights of the wrong shape, an impossible interval, a
    spread scale without an ensemble, ill-typed errors or skill: each a PredictorFormatError at load naming
    the file, the field and the value; the command exits 2 before printing anything."""
    members = _seeded_members(str(tmp_path), seeds=(0, 1))
    good = _ensemble_of(str(tmp_path), members, interval=_interval("spread"), errors=ERRORS,
                        skill={"beats_mean": True, "statement": "beats the mean"})
    record = {"seed": 0, "epoch": 3, "valid_rmse": 0.5}
    cases = {"ensemble__members": ([record], "at least 2"), "ensemble__extra_weights": ([], "0 items"),
             "ensemble__spread": (3, "3"), "interval__level": (1.0, "1.0"), "interval__scale": ("width", "'width'"),
             "interval__q": (-1, "-1"), "interval__n_calibration": (0, "0"), "interval__rule": (None, "None"),
             "errors__test": ({"n": 5, "rmse": "x", "mae": 1.0}, "'x'"), "skill__beats_mean": ("no", "'no'")}
    cases["ensemble__members[1]"] = ([record, dict(record, seed="1")], "'1'")
    for i, (key, (value, shown)) in enumerate(cases.items()):
        change = {key.replace("[1]", ""): value}
        bad = _with_meta(str(tmp_path), good, f"bad{i}.json", **change)
        e = _raises(pr.PredictorFormatError, pr.load_predictor, bad)
        field = key.replace("__", ".")
        assert bad in str(e) and f"meta.{field}" in str(e) and shown in str(e), (key, str(e))
    constant = _with_meta(str(tmp_path), good, "const.json", interval=_interval("constant", offset=0.0))
    assert "meta.interval.offset" in str(_raises(pr.PredictorFormatError, pr.load_predictor, constant))
    lone = _with_meta(str(tmp_path), members[0], "lone.json", interval=_interval("spread"))
    assert "needs an ensemble" in str(_raises(pr.PredictorFormatError, pr.load_predictor, lone))
    with open(good, encoding="utf-8") as f:
        obj = json.load(f)
    name = next(iter(obj["weights"]))
    obj["meta"]["ensemble"]["extra_weights"][0][name] = [[0.0]]
    shaped = os.path.join(str(tmp_path), "shape.json")
    with open(shaped, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    for max_members in (None, 1):                           # every member's weights are checked, used or not
        e = str(_raises(pr.PredictorFormatError, pr.load_predictor, shaped, max_members=max_members))
        assert shaped in e and "meta.ensemble.extra_weights[0]" in e and repr(name) in e, e
    rc, out, err = _predict(shaped, "CCO")
    assert rc == 2 and out == "" and "extra_weights[0]" in err, err
