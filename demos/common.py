"""Plumbing shared by the demo scripts: arguments, QUICK mode, progress lines and the results JSON.

A demo is thin: it reads its config, builds data, trains through ``transformer.train``, measures,
and hands a dict to ``Run.finish``, which writes ``results_<name>.json`` atomically with the
metadata every result must carry (seed, config, interpreter, wall time, QUICK flag).

QUICK=1 (environment variable; ``common.QUICK`` is that boolean, the only QUICK) selects the reduced
configuration of a demo: the demo's ``QUICK_OVERRIDES`` dict, applied over its ``FULL`` config by
``start(name, doc, FULL, QUICK_OVERRIDES)``.  Full runs write into
``figures/``; QUICK runs write into ``figures/quick/`` (git-ignored) unless ``--out`` is given,
so a smoke run never overwrites the committed results.
"""
import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import transformer as core  # noqa: E402  (imported after the sys.path set-up above)
import safe_io  # noqa: E402  (imported after the sys.path set-up above)

# Warnings raised inside third-party packages that this project cannot fix, each ignored by its message
# (a regular expression matched at the start, without ':') and the package whose code triggers it.  The
# one list: the demos install it when they import this module (quiet_third_party_warnings, below) and
# pytest adds it to its filterwarnings (conftest.py, third_party_warning_specs).
THIRD_PARTY_WARNINGS = [
    # DeepChem 2.8's TorchModel.fit turns a loss tensor that still requires grad into a float.
    ("Converting a tensor with requires_grad=True to a scalar", "UserWarning", "deepchem"),
    # fcd 1.2.2 (experiment 4's FCD) calls np.row_stack, an alias deprecated since NumPy 2.0.
    ("`row_stack` alias is deprecated", "DeprecationWarning", "fcd"),
    # fcd 1.2.2 passes scipy.linalg.sqrtm's disp argument, deprecated in current SciPy.
    ("The `disp` argument is deprecated", "DeprecationWarning", "fcd"),
]


def third_party_warning_specs():
    """THIRD_PARTY_WARNINGS as pytest ``filterwarnings`` lines, 'ignore:message:Category:module regex'."""
    return [f"ignore:{message}:{category}:{package}(\\..*)?" for message, category, package in THIRD_PARTY_WARNINGS]


def quiet_third_party_warnings():
    """Ignore THIRD_PARTY_WARNINGS in this process (and nothing else: the project's own warnings show)."""
    import builtins
    import warnings
    for message, category, package in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=getattr(builtins, category),
                                module=package + r"(\..*)?")


quiet_third_party_warnings()

QUICK = os.environ.get("QUICK", "").strip() not in ("", "0", "false", "False")
FIGURES = os.path.join(ROOT, "figures")


def default_out_dir():
    """figures/ for full runs, figures/quick/ for QUICK runs; RESULTS_DIR overrides both."""
    return os.environ.get("RESULTS_DIR") or (os.path.join(FIGURES, "quick") if QUICK else FIGURES)


def parse_args(description, seed=0, extra=None):
    """Common command line: --seed, --out, --workers (plus any ``extra(parser)`` additions).  ``--help``
    prints the demo's docstring with its own line breaks and exits 0 before any work; an unknown option
    is a usage error (exit 2), as argparse does."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=seed, help=f"random seed (default {seed})")
    p.add_argument("--out", default=None, help="folder for results_<name>.json (default: figures/, "
                                               "or figures/quick/ with QUICK=1)")
    p.add_argument("--workers", type=int, default=None,
                   help="training processes (default: all cores; 1 disables data parallelism)")
    p.add_argument("--extended", action="store_true",
                   help="also run the extra seeds and the 'beyond the tutorial' rows (longer)")
    if extra:
        extra(p)
    return p.parse_args()


def start(name, doc, full, quick_overrides=None, seed=0, extra=None):
    """The first lines of every demo: parse the command line, take the FULL config (updated with the
    QUICK overrides under QUICK=1), and open the Run.  Returns (args, config, run)."""
    args = parse_args(doc, seed=seed, extra=extra)
    exit_130_on_ctrl_c()
    config = dict(full)
    if QUICK and quick_overrides:
        config.update(quick_overrides)
    return args, config, Run(name, args, config)


def exit_130_on_ctrl_c():
    """A Ctrl-C that reaches the top of a demo (``transformer.train`` has already saved its checkpoint and
    printed how to resume) ends the process with status 130 and one line instead of a traceback
    (``safe_io.exit_130_on_ctrl_c``); any other exception is reported as usual."""
    safe_io.exit_130_on_ctrl_c("\ninterrupted (Ctrl-C), exit status 130: the checkpoints saved so far are kept; "
                               "run the same command again to continue from them")


def git_commit():
    """The commit the code was run from, with '-dirty' if tracked files had uncommitted changes
    (results must come from a committed tree); 'unknown' outside a git checkout.  The outputs the main
    job itself rewrites (figures/, models/, docs/, README.md) do not count: otherwise every experiment after
    the first one of ``run_all.py`` would be recorded as '-dirty' and ``--resume`` could reuse nothing."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        if not head:
            return "unknown"
        outputs = [":(exclude)figures", ":(exclude)models", ":(exclude)docs", ":(exclude)README.md"]
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *outputs],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_speed():
    """Mflop/s of ``transformer.matmul`` on (40x48)@(48x96), the best of 5 timings (bench_core's first
    shape, so it reads against figures/bench_core_py*.json): taken when a run starts and when it ends,
    because the same code runs several times slower on a slow or busy host and a wall time means little
    without it.  About 0.1 s."""
    rng = random.Random(0)
    A = [[rng.uniform(-1, 1) for _ in range(48)] for _ in range(40)]
    B = [[rng.uniform(-1, 1) for _ in range(96)] for _ in range(48)]
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        core.matmul(A, B)
        best = min(best, time.perf_counter() - t)
    return round(2 * 40 * 48 * 96 / best / 1e6, 1)


def fmt_time(seconds):
    """'1m05s' style."""
    return core.format_time(seconds)


def data_read():
    """{name: sha256} of every data file this process has read (``chemdata.data_files_read``, names relative to
    the data folder): what a results file records as ``data_sha256``, so that ``run_all --resume`` reruns a
    result whose data have changed.  {} for a process that never imported chemdata (it read no data file)."""
    chem = sys.modules.get("chemdata")
    return chem.data_files_read() if hasattr(chem, "data_files_read") else {}


def update_results(path, what, update):
    """Rewrite the results file at ``path`` after ``update(payload)`` has changed its results: the run's own
    metadata stays, and its ``updates`` list gains this call (what it did, the commit, the start time, the
    wall time, the host's matmul speed at its start and end, the data files read: ``data_sha256``), so the
    provenance line says which numbers came later and from which code and data.  Through
    ``safe_io.write_json``."""
    t0, speed0 = time.perf_counter(), machine_speed()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    update(payload)
    payload.setdefault("updates", []).append(
        {"what": what, "git_commit": git_commit(), "started_utc": started, "python": platform.python_version(),
         "wall_time_s": round(time.perf_counter() - t0, 3), "data_sha256": data_read(),
         "matmul_mflops": {"start": speed0, "end": machine_speed()}})
    safe_io.write_json(path, payload)
    return payload


class Run:
    """One experiment run: prints staged progress and writes the results file at the end."""

    def __init__(self, name, args, config):
        self.name, self.args, self.config = name, args, dict(config)
        self.out_dir = args.out or default_out_dir()
        hold_or_exit(self.out_dir, name)            # one run per results folder (refused: exit 2)
        self.extended = bool(args.extended)
        self.mode = "quick" if QUICK else ("extended" if self.extended else "default")
        self.git_commit = git_commit()              # taken at the start: the code that ran
        self.t0 = time.perf_counter()
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.speed_at_start = machine_speed()
        self.resumed_stages = []                    # tags that ``resumable`` read back from an earlier call
        self.log(f"{self.mode} run, seed {args.seed}, Python {platform.python_version()} ({core.DOT_IMPL}); "
                 f"results -> {self.path}")

    def checkpoint(self, tag):
        """Path of a training checkpoint for ``train(..., checkpoint=...)``: checkpoints/<name>/<tag>.json
        beside the results (QUICK runs keep their own), so an interrupted run resumes where it stopped."""
        return os.path.join(self.out_dir, "checkpoints", self.name, f"{tag}.json")

    def resumable(self, tag, compute):
        """``compute()``'s result, kept across calls: a stage that is not a training (sampling, scoring) and
        takes long enough to be cut off is written to checkpoints/<name>/<tag>.stage.json (atomically, with
        what it was computed under: code commit, interpreter, dot product, mode, seed, config, the data files
        read so far) when it ends, and read back by a later call of the same run instead of being
        recomputed.  The result always goes through JSON, so later stages see exactly what an uninterrupted
        run gives them.  A file written under anything else raises ``core.CheckpointMismatchError`` naming
        the field, as a training checkpoint does; delete it to start afresh."""
        path = self.checkpoint(tag)[:-len(".json")] + ".stage.json"
        key = json.loads(json.dumps(dict(self._stage_key(), data_sha256=data_read()), default=repr))
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
            diff = sorted(k for k in key if obj.get("key", {}).get(k) != key[k])
            if diff:
                raise core.CheckpointMismatchError(
                    f"stage checkpoint {path} was written for a different run (differs in {', '.join(diff)}); "
                    "delete it to start afresh")
            self.log(f"  {tag}: resumed from {path} (computed by an earlier call of this run)")
            self.resumed_stages.append(tag)
            return obj["value"]
        value = json.loads(json.dumps(compute(), allow_nan=False))
        safe_io.write_json(path, {"key": key, "value": value}, indent=None)
        return value

    def _stage_key(self):
        return {"git_commit": self.git_commit, "python": platform.python_version(), "dot_impl": core.DOT_IMPL,
                "mode": self.mode, "seed": self.args.seed, "config": self.config}

    def _earlier_stages(self):
        """Tags of this run's stage files (same code, interpreter, mode, seed, config) written before this call
        began: read back by a worker process of ``core.parallel_map``, they never reach ``resumed_stages``."""
        folder = os.path.dirname(self.checkpoint("x"))
        began = time.time() - self.elapsed()
        key = json.loads(json.dumps(self._stage_key(), default=repr))
        tags = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            path = os.path.join(folder, name)
            if not name.endswith(".stage.json") or os.path.getmtime(path) >= began:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    stored = json.load(f).get("key", {})
            except (OSError, ValueError):
                continue
            if all(stored.get(k) == v for k, v in key.items()):
                tags.append(name[:-len(".stage.json")])
        return tags

    @property
    def path(self):
        return os.path.join(self.out_dir, f"results_{self.name}.json")

    def elapsed(self):
        return time.perf_counter() - self.t0

    def log(self, msg):
        print(f"[{self.name} {fmt_time(self.elapsed())}] {msg}", flush=True)

    def stage(self, i, n, what, estimate_s=None):
        """Progress line for stage i of n, with a naive ETA from the stages done so far; a demo whose stages
        differ widely in length passes ``estimate_s`` instead: (this stage's, the rest's) seconds, from rates
        it measured on this host."""
        el = self.elapsed()
        eta = f", ETA {fmt_time(el / (i - 1) * (n - i + 1))}" if i > 1 else ""
        if estimate_s is not None:
            eta = f", about {fmt_time(estimate_s[0])} (the rest after it about {fmt_time(estimate_s[1])}; estimated)"
        self.log(f"stage {i}/{n}: {what}{eta}")

    def finish(self, results):
        """Write results_<name>.json (atomic) with the run's metadata (``data_sha256``: the sha256 of every
        data file the run read, ``data_read``); returns the path."""
        payload = {
            "experiment": self.name,
            "quick": QUICK,
            "mode": self.mode,
            "git_commit": self.git_commit,
            "seed": self.args.seed,
            "config": self.config,
            "data_sha256": data_read(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "dot_impl": core.DOT_IMPL,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "started_utc": self.started,
            "wall_time_s": round(self.elapsed(), 3),
            "matmul_mflops": {"start": self.speed_at_start, "end": machine_speed()},   # how fast this host was
            "results": results,
        }
        resumed = self.resumed_stages + [t for t in self._earlier_stages() if t not in self.resumed_stages]
        if resumed:                                 # its wall time is then this call's only
            payload["resumed_stages"] = resumed
        safe_io.write_json(self.path, payload)
        self.log(f"done in {fmt_time(self.elapsed())}: wrote {self.path}")
        return self.path


# ----------------------------------------------------------------------------- one run per results folder
#
# Two runs writing one results folder would credit each other's files to the wrong experiments and resume
# from each other's checkpoints.  So the first process that writes a folder (run_all.py, or a demo run on
# its own) holds an exclusive lock on it: safe_io.hold_lock on <folder>/.run_lock.json, flock(2) on that
# record, which also says who holds it (pid, command, start time).  The kernel releases the lock however the
# holder ends, kill -9 included, so a dead run's record is taken over by the next; a clean exit removes it.
# run_all's children inherit its lock through RUN_LOCK_ENV, which names run_all's pid and the folder.  The
# folder is checked first (safe_io.check_folder): one that cannot hold files is refused before any work.

RUN_LOCK_FILE = ".run_lock.json"
RUN_LOCK_ENV = "CHEM_RUN_LOCK"
_HELD_LOCKS = {}                                   # folder -> open descriptor holding its lock


class FolderBusyError(RuntimeError):
    """Another live process is writing the same results folder; the message names it."""


def _lock_token(folder, pid):
    return f"{pid}:{os.path.realpath(folder)}"


def hold_results_folder(folder):
    """Take ``folder`` for this process, or raise FolderBusyError naming the process that holds it; a folder
    that cannot hold files (a file, under a file, read-only) raises safe_io.UnsafeOutputError first.  A child
    of run_all.py writing run_all's folder inherits run_all's lock; a lock held only in a record left by a
    process that has died is taken over.  Returns the child environment entry {RUN_LOCK_ENV: token} that
    hands the lock down to the scripts this process starts.  No lock where fcntl is missing (Windows)."""
    folder = os.path.realpath(folder)
    token = {RUN_LOCK_ENV: _lock_token(folder, os.getpid())}
    if folder in _HELD_LOCKS or os.environ.get(RUN_LOCK_ENV) == _lock_token(folder, os.getppid()):
        return token
    safe_io.check_folder(folder)
    record = os.path.join(folder, RUN_LOCK_FILE)
    try:
        fd, previous = safe_io.hold_lock(record)
    except safe_io.BusyError as e:
        raise FolderBusyError(f"the results folder {folder} is in use by {e.holder}; wait for it to finish or "
                              "stop it, or write elsewhere (RESULTS_DIR=... or --out)") from None
    except OSError as e:                           # a file system without locks: run, but say so
        print(f"note: cannot lock {folder} ({e}); a second run on it would not be refused", flush=True)
        return token
    _HELD_LOCKS[folder] = fd                       # kept open until this process ends
    if previous is not None:                       # left by a run that was killed: its lock died with it
        print(f"note: {folder} was held by {safe_io.describe_record(previous)}, which has ended; taking it over",
              flush=True)
    import atexit
    atexit.register(_drop_record, record, fd, os.getpid())
    return token


def _drop_record(record, fd, pid):
    """At exit: remove this process's record and release the lock (not in a forked child)."""
    if os.getpid() == pid:
        safe_io.release_lock(record, fd)


def hold_or_exit(folder, who):
    """``hold_results_folder`` for a command: a busy folder, or one that cannot hold files, is one line on
    stderr and exit status 2, before any work."""
    try:
        return hold_results_folder(folder)
    except FolderBusyError as e:
        print(f"{who}: refused: {e}", file=sys.stderr, flush=True)
    except safe_io.UnsafeOutputError as e:
        print(f"{who}: refused: cannot use the results folder: {e}", file=sys.stderr, flush=True)
    raise SystemExit(2)
