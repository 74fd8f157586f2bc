"""The main job and the command lines: run_all reports missing and failing experiments, resumes what is
current, keeps one run per results folder and removes its test folders; the tour notebook runs top to
bottom; every script's --help and bad options; Ctrl-C saves, says how to resume and exits 130; fetch
offline; load_predictor names its file in every error.  The stand-in checkout these tests run in is
tests_studies._fake_checkout.

    python -m pytest tests/tests_commands.py      (or: python tests/tests_commands.py)
"""
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from tests_studies import ROOT, _fake_checkout, _real_data_dir, _temp_folder, slow
from tests_transformer import _raises

sys.path.insert(0, os.path.join(ROOT, "demos"))
import experiments


# ----------------------------------------------------------------------------- run_all (the main job)

def _default_sigint():
    """In the child, before exec: the default SIGINT action.  A test run started in the background (nohup,
    or & in a script) ignores SIGINT, a child inherits that, and the Ctrl-C a test sends would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _started(cmd, folder, env):
    """Start ``cmd`` for a test that interrupts it: in its own process group (so that ``_reaped`` can stop
    the whole group, workers included, when the test fails), with the default SIGINT action."""
    return subprocess.Popen(cmd, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)


@contextlib.contextmanager
def _reaped(proc):
    """Whatever the test's outcome, nothing it started outlives it: a group still running is killed."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _run_all(folder, *args, env_extra=None, wait=True):
    env = dict(os.environ, RESULTS_DIR=os.path.join(folder, "out"), **(env_extra or {}))
    env.pop("QUICK", None)
    cmd = [sys.executable, os.path.join(folder, "demos", "run_all.py"), "--quick", "--no-figures", *args]
    if not wait:
        return _started(cmd, folder, env)
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
        assert sum(r["status"] == "missing" for r in rows.values()) == len(experiments.EXPERIMENTS) - 3
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
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d)
        marker = os.path.join(d, "sleeping")
        with _reaped(_run_all(d, "--only", "positional,dropout", env_extra={"FAKE_SLEEP_dropout": marker},
                              wait=False)) as proc:
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


_DATA_DEMO = '''"""A stand-in experiment that reads a data file: the mean measured ESOL solubility (and a stage
checkpoint that depends on it, as a scoring stage would)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import chemdata, common
args, config, run = common.start("esolmean", __doc__, {"size": 3}, {"size": 1})
y = chemdata.load_esol().y
run.finish({"mean": run.resumable("mean", lambda: sum(y) / len(y)), "checks": {"ok": True}})
'''


def _shift_esol(path, by):
    """Add ``by`` to every measured solubility of a copy of delaney-processed.csv."""
    import csv
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("measured log solubility in mols per litre")
    for row in rows[1:]:
        row[col] = repr(float(row[col]) + by)
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def t_run_all_resume_reruns_an_experiment_whose_data_changed():
    """Every results file records the sha256 of each data file its run read (data_sha256); --resume counts
    an experiment current only while those files are unchanged: after every ESOL value is raised by 3.0
    in the data folder ($CHEMDATA_DIR), the experiment reruns, the log names the file, its checkpoints from
    the old data are dropped and the new mean is 3.0 higher (it used to be skipped as current)."""
    import shutil
    from chemdata import sha256_of
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("positional",), extra={"demos/demo_esolmean.py": _DATA_DEMO})
        data = os.path.join(d, "elsewhere")
        os.mkdir(data)
        esol = shutil.copy(os.path.join(_real_data_dir(), "delaney-processed.csv"), data)
        env = {"CHEMDATA_DIR": data, "CHEMDATA_OFFLINE": "1"}
        rc, log = _run_all(d, "--only", "esolmean,positional", env_extra=env)
        with open(os.path.join(d, "out", "results_esolmean.json"), encoding="utf-8") as f:
            before = json.load(f)
        assert rc == 0 and before["data_sha256"] == {"delaney-processed.csv": sha256_of(esol)}, log
        with open(os.path.join(d, "out", "results_positional.json"), encoding="utf-8") as f:
            assert json.load(f)["data_sha256"] == {}                     # read no data file
        rc, log = _run_all(d, "--only", "esolmean,positional", "--resume", env_extra=env)
        assert rc == 0 and "current (results_esolmean.json); skipped" in log, log
        _shift_esol(esol, 3.0)
        rc, log = _run_all(d, "--only", "esolmean,positional", "--resume", env_extra=env)
        _, rows = _summary(d)
        assert rc == 0 and rows["esolmean"]["status"] == "ok" and rows["positional"]["status"] == "current", log
        assert "not current: data changed: delaney-processed.csv" in log and "computed from the old data" in log, log
        with open(os.path.join(d, "out", "results_esolmean.json"), encoding="utf-8") as f:
            after = json.load(f)
        assert abs(after["results"]["mean"] - before["results"]["mean"] - 3.0) < 1e-9, log
        assert after["data_sha256"] == {"delaney-processed.csv": sha256_of(esol)}


def t_run_all_only_that_names_nothing_is_a_usage_error():
    """``--only ,`` (or an empty name) runs nothing: a usage error naming it, exit 2, not a run of 0 jobs that
    exits 0."""
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("positional",))
        for only in (",", " "):
            rc, log = _run_all(d, "--only", only)
            assert rc == 2 and "names no experiment" in log and "positional" in log, log
            assert not os.path.exists(os.path.join(d, "out", "run_all_summary.json"))


def _folder_bytes(folder):
    """{relative path: bytes} of every file under folder."""
    out = {}
    for base, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                out[os.path.relpath(os.path.join(base, name), folder)] = f.read()
    return out


def t_one_run_per_results_folder():
    """While a run_all writes a results folder, a second run_all on it, or a demo on its own writing into
    it, refuses at once (exit 2) naming the first one's pid and command, and changes nothing there (two
    runs used to both exit 0, crediting each other's files and checkpoints).  The lock goes with its
    holder: once the first has stopped the folder is free again, a record left by a process that died is
    taken over, and a clean exit leaves no record behind."""
    import signal
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d)
        out, marker = os.path.join(d, "out"), os.path.join(d, "sleeping")
        first = _run_all(d, "--only", "dropout", env_extra={"FAKE_SLEEP_dropout": marker}, wait=False)
        with _reaped(first):
            t0 = time.time()
            while not os.path.exists(marker) and time.time() - t0 < 120 and first.poll() is None:
                time.sleep(0.1)
            before = _folder_bytes(out)
            t0 = time.time()
            rc, log = _run_all(d, "--only", "positional")
            assert rc == 2 and f"pid {first.pid}" in log and "run_all.py" in log and "refused" in log, log
            assert time.time() - t0 < 20, "the second run_all should refuse at once"
            env = dict(os.environ, RESULTS_DIR=out, QUICK="1")
            demo = subprocess.run([sys.executable, os.path.join(d, "demos", "demo_positional.py")], env=env, cwd=d,
                                  capture_output=True, text=True, timeout=120)
            assert demo.returncode == 2 and f"pid {first.pid}" in demo.stderr, demo.stdout + demo.stderr
            assert _folder_bytes(out) == before                  # the first run's files are unchanged
            assert ".run_lock.json" in before
            first.send_signal(signal.SIGINT)
            first.communicate(timeout=120)
        assert first.returncode == 130
        with open(os.path.join(out, ".run_lock.json"), "w", encoding="utf-8") as f:   # a dead run's record
            json.dump({"pid": first.pid, "command": ["run_all.py"], "started_utc": "then"}, f)
        rc, log = _run_all(d, "--only", "positional")
        _, rows = _summary(d)
        assert rc == 0 and rows["positional"]["status"] == "ok" and "taking it over" in log, log
        assert ".run_lock.json" not in os.listdir(out)


_READ_ONLY = """import errno, os, runpy, sys, tempfile
# Run the script sys.argv[1] as if $READ_ONLY_DIR were on a read-only file system: creating a file there
# fails with EROFS, as it does on a read-only mount (the tests run as root, whom chmod does not stop).
folder, real = os.path.realpath(os.environ["READ_ONLY_DIR"]), tempfile.mkstemp
def mkstemp(*args, dir=None, **kw):
    if dir is not None and os.path.realpath(dir) == folder:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), dir)
    return real(*args, dir=dir, **kw)
tempfile.mkstemp = mkstemp
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))   # as python SCRIPT does
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def t_an_unusable_results_folder_is_one_line_and_exit_2_before_any_work():
    """RESULTS_DIR naming a file, a folder under a file, or a read-only folder: run_all and a demo run on its
    own each say in one line which folder and what is wrong, exit 2, and write nothing (they used to end in
    FileExistsError, NotADirectoryError or [Errno 30] tracebacks from the lock)."""
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=("positional",))
        a_file, read_only = os.path.join(d, "a_file"), os.path.join(d, "ro")
        with open(a_file, "w", encoding="utf-8") as f:
            f.write("x")
        os.mkdir(read_only)
        if os.geteuid() != 0:
            os.chmod(read_only, 0o555)                 # a real read-only folder where chmod binds
        cases = [(a_file, "it is a file, not a folder"), (os.path.join(a_file, "sub"), "above it is a file"),
                 (read_only, "no file can be created in it")]
        scripts = [[os.path.join(d, "demos", "run_all.py"), "--quick", "--no-figures", "--only", "positional"],
                   [os.path.join(d, "demos", "demo_positional.py")]]
        try:
            for script in scripts:
                for folder, why in cases:
                    env = dict(os.environ, RESULTS_DIR=folder, READ_ONLY_DIR=read_only, QUICK="1")
                    proc = subprocess.run([sys.executable, "-c", _READ_ONLY, *script], env=env, cwd=d,
                                          capture_output=True, text=True, timeout=120)
                    err = proc.stderr.strip()
                    assert proc.returncode == 2 and why in err and folder in err, (script, proc.stdout + err)
                    assert len(err.splitlines()) == 1 and "Traceback" not in proc.stdout + err, err
        finally:
            os.chmod(read_only, 0o755)
        assert os.listdir(read_only) == [] and not os.path.isdir(os.path.join(d, "figures"))
        with open(a_file, encoding="utf-8") as f:
            assert f.read() == "x"


def t_test_folders_are_removed_when_the_tests_end():
    """The temporary folders of these tests (QUICK runs of up to 11 MB with a copy of the code) are removed
    when the test process ends instead of piling up in the temp folder."""
    code = "import tests_studies; print(tests_studies._temp_folder('probe-'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                          capture_output=True, text=True, timeout=120)
    folder = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and folder.startswith(tempfile.gettempdir()), proc.stdout + proc.stderr
    assert not os.path.exists(folder), folder


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


@slow
def t_tour_notebook_runs_top_to_bottom():
    """demos/tour.ipynb is committed without outputs and executes cleanly (nbclient, a fresh kernel)."""
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


# ----------------------------------------------------------------------------- command lines, offline set-up, Ctrl-C

def _docstring_lines(path, n=4):
    """The first n non-empty lines of a script's module docstring, as argparse must print them."""
    import ast
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()), clean=False) or ""
    return [line.rstrip() for line in doc.splitlines() if line.strip()][:n]


def t_every_script_help_exits_0_with_its_layout_and_bad_options_exit_2():
    demos = sorted(glob.glob(os.path.join(ROOT, "demos", "demo_*.py")))
    scripts = demos + [os.path.join(ROOT, "demos", "run_all.py"), os.path.join(ROOT, "demos", "bench_core.py")]
    cmds = {os.path.relpath(p, ROOT): [p, "--help"] for p in scripts}
    cmds.update({"chemdata": ["chemdata.py", "--help"], "chemdata fetch": ["chemdata.py", "fetch", "--help"],
                 "chemdata check": ["chemdata.py", "check", "--help"], "predict_files": ["predict_files.py", "--help"]})
    bad = {"chemdata bogus": ["chemdata.py", "bogus"], "chemdata --bogus": ["chemdata.py", "--bogus"],
           "predict_files --bogus": ["predict_files.py", "m.json", "--bogus"],
           "demo --bogus": [demos[0], "--bogus"], "bench_core --bogus": ["demos/bench_core.py", "--bogus"]}
    env = dict(os.environ, RESULTS_DIR=_temp_folder("help-"))
    procs = {k: subprocess.Popen([sys.executable, *c], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, c in {**cmds, **bad}.items()}
    done = {k: (p.communicate(timeout=120), p.returncode) for k, p in procs.items()}
    for key in cmds:
        (out, err), rc = done[key]
        assert rc == 0 and out.startswith("usage:") and not err, (key, rc, err[-500:])
    for path in scripts:                                         # the docstring keeps its line breaks
        out = done[os.path.relpath(path, ROOT)][0][0]
        lines = out.splitlines()
        assert all(line in lines for line in _docstring_lines(path)), (path, out[:600])
    assert done["chemdata fetch"][0][0] != done["chemdata check"][0][0]
    for key in bad:
        (out, err), rc = done[key]
        assert rc == 2 and "usage:" in err, (key, rc, out[-300:], err[-300:])
    assert os.listdir(env["RESULTS_DIR"]) == []                  # no script did any work


def t_bench_core_writes_the_tracked_file_only_when_asked():
    import bench_core
    tracked = os.path.join(ROOT, "figures", "bench_core_py3.11.json")
    env = {k: v for k, v in os.environ.items() if k not in ("RESULTS_DIR", "QUICK")}
    from unittest import mock
    with mock.patch.dict(os.environ, env, clear=True):
        plain = bench_core.out_path(bench_core.parse_args([]), "3.11.7")
        saved = bench_core.out_path(bench_core.parse_args(["--save"]), "3.11.7")
        chosen = bench_core.out_path(bench_core.parse_args(["--out", "/x"]), "3.11.7")
    assert plain == os.path.join(ROOT, "figures", "quick", "bench_core_py3.11.json") != tracked
    assert chosen == "/x/bench_core_py3.11.json"
    if not bench_core.common.QUICK:
        assert saved == tracked
    import run_all
    args = run_all.parse_args(["--bench", "--no-figures"])[1]
    assert run_all.build_jobs(args, [], "f")[-1][1][-1] == "--save"


_TRAINING_DEMO = '''"""A stand-in experiment that trains a tiny LM with 2 workers and a checkpoint until it is \
interrupted."""
import os, random, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common
import transformer as core
args, config, run = common.start("train", __doc__, {"epochs": 100000})
rng = random.Random(0)
data = [[rng.randrange(12) for _ in range(12)] for _ in range(8)]
model = core.TransformerLM(vocab_size=12, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)


def touch(model, epoch):
    if epoch == 2:
        open(os.environ["FAKE_TRAINING_MARKER"], "w").close()


core.train(model, data, core.lm_loss, epochs=config["epochs"], batch_size=8, workers=2, verbose=False,
         epoch_fn=touch, checkpoint=run.checkpoint("lm"), checkpoint_every=1e9)
'''


def _ctrl_c(cmd, folder, env):
    """Start cmd in its own process group, wait until the training demo has trained 2 epochs, press Ctrl-C
    (SIGINT to the whole group, as a terminal does); returns (exit code, output, seconds to exit)."""
    import signal
    marker = os.path.join(folder, "training")
    if os.path.exists(marker):
        os.remove(marker)
    env = dict(os.environ, FAKE_TRAINING_MARKER=marker, **env)
    env.pop("QUICK", None)
    with _reaped(_started(cmd, folder, env)) as proc:
        t0 = time.time()
        while not os.path.exists(marker) and proc.poll() is None and time.time() - t0 < 120:
            time.sleep(0.05)
        time.sleep(0.2)
        t1 = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        return proc.returncode, out, time.time() - t1


def t_ctrl_c_saves_says_how_to_resume_and_exits_130_at_once():
    with tempfile.TemporaryDirectory() as d:
        _fake_checkout(d, names=(), extra={"demos/demo_train.py": _TRAINING_DEMO})
        rc, out, wait = _ctrl_c([sys.executable, "demos/demo_train.py"], d, {"RESULTS_DIR": os.path.join(d, "a")})
        assert rc == 130 and "Traceback" not in out and "run the same command again" in out, out
        assert os.path.exists(os.path.join(d, "a", "checkpoints", "train", "lm.json")) and wait < 2.0, (wait, out)
        rc, out, wait = _ctrl_c([sys.executable, "demos/run_all.py", "--only", "train", "--no-figures"], d,
                                {"RESULTS_DIR": os.path.join(d, "b")})
        assert rc == 130 and "Traceback" not in out and "To resume" in out and "--resume" in out, out
        assert wait < 2.0, (wait, out)


def t_fetch_offline_names_each_file_once_with_its_folder_and_reads_the_archive():
    import contextlib
    import io
    import tarfile
    from unittest import mock
    import chemdata

    def no_network(url):
        raise OSError("no network")
    real = _real_data_dir()
    with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"CHEMDATA_DIR": d}), \
            mock.patch.object(chemdata, "_fetch_url", no_network), \
            mock.patch.object(chemdata, "_fetch_wheel", no_network):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            assert chemdata.main(["fetch"]) == 1
        lines = err.getvalue().splitlines()
        assert len(lines) == len(chemdata.DATA_FILES), lines
        for name in chemdata.DATA_FILES:
            base = os.path.basename(name)
            mine = [ln for ln in lines if f"'{base}'" in ln or ln.startswith(f"fetch: {base} ")]
            assert len(mine) == 1, (name, lines)
            folder = os.path.dirname(os.path.join(d, name))
            assert f"put it in {folder} " in mine[0] or "built from" in mine[0] or "hopv.tar.gz" in mine[0], mine
        assert "hopv.tar.gz as downloaded" in err.getvalue()
        assert os.listdir(d) == []
        with open(os.path.join(real, "hopv.csv"), "rb") as f:
            content = f.read()
        with tarfile.open(os.path.join(d, "hopv.tar.gz"), "w:gz") as tar:    # the archive as downloaded
            member = tarfile.TarInfo("hopv/hopv.csv")
            member.size = len(content)
            tar.addfile(member, io.BytesIO(content))
        assert len(chemdata.load_hopv(download=False)) == 233
        assert chemdata.check_data_files()["hopv.csv"] == "ok"


def t_deepchem_cross_check_that_cannot_run_is_skipped_with_its_reason():
    import types
    from unittest import mock
    import property_common as pc

    def offline(**kwargs):
        raise OSError("Name or service not known")
    fake = types.SimpleNamespace(molnet=types.SimpleNamespace(load_delaney=offline))
    with tempfile.TemporaryDirectory() as d, mock.patch.object(pc, "deepchem_available", lambda: (True, "9.9")), \
            mock.patch.dict(sys.modules, {"deepchem": fake}):
        with mock.patch.dict(os.environ, {"CHEMDATA_DIR": d}):
            ok, reason, _, _ = pc.deepchem_molnet("load_delaney")
            assert not ok and "delaney-processed.csv is not in the data folder" in reason and d in reason
        with mock.patch.dict(os.environ, {"CHEMDATA_DIR": _real_data_dir()}):
            ok, reason, _, _ = pc.deepchem_molnet("load_delaney")
            assert not ok and "load_delaney failed: OSError: Name or service not known" in reason
        assert os.listdir(d) == []


def t_load_predictor_names_the_file_in_every_error():
    import predictor
    with open(os.path.join(ROOT, "models", "esol_transformer.json"), encoding="utf-8") as f:   # read only
        good = json.load(f)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.json")
        meta = dict(good["meta"], vocab_tokens=good["meta"]["vocab_tokens"][:-1])
        for raw, fragment in ((json.dumps(good)[:300].encode(), "JSONDecodeError"), (b"\xe9{}", "UnicodeDecodeError"),
                              (json.dumps(dict(good, meta=meta)).encode(), "vocab_size"),
                              (b"[1, 2]", "not a model file")):
            with open(path, "wb") as f:
                f.write(raw)
            e = _raises(predictor.PredictorFormatError, lambda: predictor.load_predictor(path))
            assert path in str(e) and fragment in str(e), str(e)
            assert open(path, "rb").read() == raw and os.listdir(d) == ["m.json"]



if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
