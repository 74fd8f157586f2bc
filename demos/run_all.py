"""The main job: run every experiment script, each in its own process, then make_figures.py (the summary of
every study the tutorial's section 10.10 closes with is the README's overview table it writes).

    python demos/run_all.py                 # default mode -> figures/results_*.json, figures, docs/ pages, README
    python demos/run_all.py --extended      # --extended for every experiment (extra seeds, "beyond" rows)
    python demos/run_all.py --quick         # QUICK=1 for every script -> figures/quick/ (or $RESULTS_DIR)
    python demos/run_all.py --only positional,dropout
    python demos/run_all.py --resume        # skip experiments whose results are current; continue the rest
    python demos/run_all.py --bench         # also demos/bench_core.py (speed table in the README)
    RESULTS_DIR=figures/py3.13 python3.13 demos/run_all.py   # another interpreter, kept apart (no README)

The experiments are the rows of demos/experiments.py (the tutorial's eleven scripts in its order: the
experiment list of its appendix B, run as its appendix C's run list does; then the studies beyond it;
other demos/demo_*.py run after them); a script that does not exist yet is reported as "missing", a
failing one as "failed", and the others still run.  After every job
the summary ``run_all_summary.json`` is rewritten (atomically) in the results folder and, at the end,
printed as a table: per experiment its status, wall time, results file(s) (relative to the results
folder), git_commit, interpreter and mode, and the total.  $RESULTS_DIR moves the results, the
summary and the checkpoints together (the demos read it too).  One run writes a results folder at a
time: a second run_all (or a demo on its own) on the same folder refuses at once, naming the process
that holds it (common.hold_results_folder; exit status 2).  Each stage prints one progress line
with the elapsed time and an ETA for the whole job taken from the previous summary's times (when
there is one for the same mode).

Resuming.  An experiment is *current*, and ``--resume`` skips it, when the previous summary lists it
as done and each of its results files still exists with ``git_commit`` equal to HEAD (a clean tree),
the same mode, the same configuration hash (config + seed) as the summary recorded, and the same data:
every data file it records in ``data_sha256`` still has that sha256 (a results file without the field,
written before it existed, is not current).  Anything else is run again (a changed data file is named,
and the experiment's checkpoints, computed from the old data, are removed first); an interrupted
experiment continues from its training checkpoints, because every
demo passes ``checkpoint=run.checkpoint(tag)`` to ``transformer.train``, which resumes by itself (a
plain run resumes from them too; delete ``<results folder>/checkpoints/`` for a from-scratch timing).
The time an interrupted attempt had already spent is added to the experiment's wall time, so the
summary's total stays the cost of one complete run.  Ctrl-C (or SIGTERM) stops the running
experiment, writes the summary and prints the exact command that resumes.

Exit code: 0 when everything that exists ran (or was current), 1 if something failed, 130 on Ctrl-C.
"""
import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402  (demos/common.py: git_commit; it puts ROOT on sys.path)
import chemdata  # noqa: E402  (the data folder and sha256_of: is a result current on the data?)
import experiments  # noqa: E402  (demos/experiments.py: the studies, in the tutorial's order)
import safe_io  # noqa: E402  (imported after the sys.path set-up above)

SUMMARY = "run_all_summary.json"
DONE = ("ok", "current")          # statuses whose results may be reused by --resume
GRACE_S = 20.0                    # after Ctrl-C, how long a demo gets to stop before it is killed


def discover():
    """[(name, script path or None)]: every experiment of demos/experiments.py in its order (None when its
    script is missing), then any other demos/demo_*.py alphabetically."""
    order = experiments.scripts()
    present = sorted(os.path.basename(p)[5:-3] for p in glob.glob(os.path.join(HERE, "demo_*.py")))
    out = [(n, os.path.join(HERE, f"demo_{n}.py") if n in present else None) for n in order]
    return out + [(n, os.path.join(HERE, f"demo_{n}.py")) for n in present if n not in order]


def results_dir(quick):
    """Where the demos write (they read the same RESULTS_DIR): figures/, figures/quick/, or $RESULTS_DIR."""
    return os.path.abspath(os.environ.get("RESULTS_DIR") or
                           os.path.join(ROOT, "figures", "quick" if quick else ""))


def snapshot(folder):
    """{path: modification time} of the results files in folder (to see which ones a job wrote):
    results_*.json and the benchmark's bench_core_*.json (not the models QUICK runs save there)."""
    files = glob.glob(os.path.join(folder, "results_*.json")) + glob.glob(os.path.join(folder, "bench_core_*.json"))
    return {f: os.stat(f).st_mtime_ns for f in files}


def fmt(seconds):
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s"


def read_json(path):
    """The parsed file, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def config_hash(payload):
    """Short sha256 of a results file's config and seed (None when the file records no config)."""
    if not isinstance(payload, dict) or "config" not in payload:
        return None
    blob = json.dumps({"config": payload["config"], "seed": payload.get("seed")}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def interpreter():
    return f"{platform.python_implementation()} {platform.python_version()}"


def describe(paths, folder):
    """Row fields read from the results files a job wrote: names (relative to the results folder),
    git_commit, interpreter, mode and the config hash of each file."""
    payloads = {os.path.relpath(p, folder): read_json(p) for p in sorted(paths)}
    good = [p for p in payloads.values() if isinstance(p, dict)]

    def one(key, default=None):
        vals = sorted({str(p[key]) for p in good if p.get(key) is not None})
        return ", ".join(vals) if vals else default
    interp = sorted({f"{p.get('implementation', 'CPython')} {p['python']}" for p in good if p.get("python")})
    return {"results": list(payloads), "git_commit": one("git_commit"), "mode": one("mode"),
            "interpreter": ", ".join(interp) or interpreter(),
            "config_hash": {name: config_hash(p) for name, p in payloads.items()}}


def is_current(prev, folder, head, mode):
    """(True, '') when the previous summary row's results can be reused, else (False, why not)."""
    if head.endswith("-dirty") or head == "unknown":
        return False, "the working tree is not a clean checkout"
    if not prev or prev.get("status") not in DONE:
        return False, "no completed run in the last summary"
    if not prev.get("results"):
        return False, "the last run wrote no results file"
    if prev.get("mode") != mode:
        return False, f"last run was in mode {prev.get('mode')}"
    for name, recorded in (prev.get("config_hash") or {}).items():
        payload = read_json(os.path.join(folder, name))
        if not isinstance(payload, dict):
            return False, f"{name} is missing or unreadable"
        if payload.get("git_commit") != head:
            return False, f"{name} comes from {payload.get('git_commit')}, HEAD is {head}"
        if payload.get("mode") != mode:
            return False, f"{name} is mode {payload.get('mode')}"
        if recorded is None or config_hash(payload) != recorded:
            return False, f"{name}'s configuration differs from the one the summary recorded"
        changed = data_changed(payload, name)
        if changed:
            return False, changed
    return True, ""


def data_changed(payload, name):
    """'' when every data file the results payload of file ``name`` records (``data_sha256``: the run's, then
    each update's) still has that sha256 in the data folder ($CHEMDATA_DIR, else data/), else why not: 'data
    changed: FILE, ...', or that it records no data (written before results recorded them: not current, the
    safe reading)."""
    if not isinstance(payload.get("data_sha256"), dict):
        return f"{name} records no data_sha256 (written before results recorded their data files)"
    records = [payload["data_sha256"]] + [u.get("data_sha256") for u in payload.get("updates") or []
                                          if isinstance(u, dict)]
    changed = sorted({name for record in records if isinstance(record, dict) for name, digest in record.items()
                      if _data_sha256(name) != digest})
    return f"data changed: {', '.join(changed)}" if changed else ""


_DIGESTS = {}


def _data_sha256(name):
    """The sha256 of data file ``name`` (relative to the data folder, or absolute) now; None if it is gone."""
    path = name if os.path.isabs(name) else os.path.join(chemdata.data_dir(), name)
    try:
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in _DIGESTS:
            _DIGESTS[key] = chemdata.sha256_of(path)
        return _DIGESTS[key]
    except OSError:
        return None


def drop_stale_checkpoints(row, folder):
    """Before an experiment reruns because its data changed: remove the checkpoints its results files' runs
    kept (<folder>/checkpoints/<experiment>/), computed from the old data (training would refuse them)."""
    for name in row.get("results") or []:
        payload = read_json(os.path.join(folder, name))
        experiment = str(payload.get("experiment") or "") if isinstance(payload, dict) else ""
        stale = os.path.join(folder, "checkpoints", experiment)
        if experiment not in ("", ".", "..") and os.path.basename(experiment) == experiment and os.path.isdir(stale):
            shutil.rmtree(stale)
            print(f"[run_all] removed {stale}: computed from the old data", flush=True)


def results_fingerprint(folder):
    """Short sha256 of the results files in folder (names and modification times): make_figures' input."""
    blob = json.dumps(sorted((os.path.basename(f), m) for f, m in snapshot(folder).items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def figures_current(prev, folder, head):
    """(True, '') when make_figures' last run in this mode was at this clean commit and saw exactly the
    results files there are now (--resume then has nothing to redraw), else (False, why not)."""
    if head.endswith("-dirty") or head == "unknown":
        return False, "the working tree is not a clean checkout"
    if not prev or prev.get("status") not in DONE:
        return False, "no completed make_figures run in the last summary"
    if prev.get("git_commit") != head:
        return False, f"the figures were made at {prev.get('git_commit')}, HEAD is {head}"
    if prev.get("inputs") != results_fingerprint(folder):
        return False, "results files changed since the figures were made"
    return True, ""


def eta_text(jobs, i, expected):
    """ETA of jobs[i:] from the previous summary's wall times (None for a job it does not know)."""
    rest = [expected.get(name) for name, _ in jobs[i:]]
    known = [x for x in rest if x is not None]
    if not known:
        return "ETA unknown (no time for the remaining jobs in a previous summary of this mode)"
    unknown = len(rest) - len(known)
    return f"ETA {fmt(sum(known))}" + (f" + {unknown} job(s) without a previous time" if unknown else "") \
        + " (last summary's times)"


def run_job(cmd, env):
    """Run one script; returns (exit code, wall seconds, interrupted?).  On Ctrl-C the script gets
    SIGINT and GRACE_S seconds to stop (it saves a training checkpoint); a second Ctrl-C kills it at once."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, preexec_fn=_default_sigint)
    except OSError as e:
        print(f"[run_all] could not start {cmd}: {e}", flush=True)
        return 127, time.perf_counter() - t0, False
    try:
        return proc.wait(), time.perf_counter() - t0, False
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reached the script too (it saves a checkpoint: do not interrupt that with a
        # second SIGINT too soon); a SIGTERM or a kill -INT to run_all alone did not: forward one.
        try:
            try:
                proc.wait(timeout=0.0 if _TERMINATED else 5.0)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=GRACE_S)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        return proc.returncode, time.perf_counter() - t0, True


_TERMINATED = False


def _default_sigint():
    """In the child before exec: SIGINT at its default, so Python turns it into KeyboardInterrupt even when
    run_all itself was started with SIGINT ignored (a background job of a script, nohup ... &)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigterm(signum, frame):
    """SIGTERM stops the job like Ctrl-C does (the running script is sent SIGINT at once)."""
    global _TERMINATED
    _TERMINATED = True
    raise KeyboardInterrupt


def resume_command(argv):
    """The exact command that resumes this job."""
    args = list(argv) + ([] if "--resume" in argv else ["--resume"])
    env = f"RESULTS_DIR={shlex.quote(os.environ['RESULTS_DIR'])} " if os.environ.get("RESULTS_DIR") else ""
    return f"cd {shlex.quote(ROOT)} && {env}{shlex.join([sys.executable, 'demos/run_all.py', *args])}"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="QUICK=1 for every script (results in figures/quick/)")
    p.add_argument("--extended", action="store_true", help="pass --extended to every experiment")
    p.add_argument("--resume", action="store_true",
                   help="skip experiments whose results are current (same commit, mode and config)")
    p.add_argument("--only", action="append", default=[],
                   help="run only these experiments (comma-separated names, e.g. positional,dropout)")
    p.add_argument("--bench", action="store_true", help="also run demos/bench_core.py")
    p.add_argument("--no-figures", action="store_true", help="skip make_figures.py")
    return p, p.parse_args(argv)


def select(p, args):
    """The experiments to run: [(name, script or None)], honouring --only."""
    found = discover()
    if not args.only:
        return found
    wanted = [w.strip() for arg in args.only for w in arg.split(",") if w.strip()]
    if not wanted:
        p.error(f"--only {' '.join(map(repr, args.only))} names no experiment; known: "
                f"{', '.join(n for n, _ in found)}")
    unknown = [w for w in wanted if w not in {n for n, _ in found}]
    if unknown:
        p.error(f"unknown experiment(s) {unknown}; known: {', '.join(n for n, _ in found)}")
    return [(n, s) for n, s in found if n in wanted]


def build_jobs(args, experiments, folder):
    """[(name, command or None)] for the experiments, the benchmark and make_figures."""
    flags = ["--extended"] if args.extended else []
    jobs = [(n, [sys.executable, s, *flags] if s else None) for n, s in experiments]
    if args.bench:
        jobs.append(("bench_core", [sys.executable, os.path.join(HERE, "bench_core.py"), "--save"]))
    if not args.no_figures:
        cmd = [sys.executable, os.path.join(ROOT, "make_figures.py"), "--dir", folder]
        main_folder = os.path.abspath(folder) == os.path.join(ROOT, "figures")   # only it feeds the README and docs/
        jobs.append(("make_figures", cmd + (["--readme"] if main_folder and not args.quick else [])))
    return jobs


def child_env(quick, folder):
    env = dict(os.environ)
    if env.get("RESULTS_DIR"):
        env["RESULTS_DIR"] = folder           # absolute: the scripts run from the repository root
    if env.get("CHEMDATA_DIR"):
        env["CHEMDATA_DIR"] = chemdata.data_dir()      # absolute too: the data is-current checks
    if quick:
        env["QUICK"] = "1"
    else:
        env.pop("QUICK", None)
    return env


def new_row(name, cmd, status, mode):
    script = os.path.relpath(cmd[1], ROOT) if cmd else f"demos/demo_{name}.py"
    return {"name": name, "script": script, "status": status, "wall_time_s": 0.0, "ran": False,
            "results": [], "git_commit": None, "interpreter": interpreter(), "mode": mode,
            "config_hash": {}, "note": ""}


def write_summary(path, meta, rows, t_all):
    """Rewrite the summary file (atomically): the job's metadata, one row per job and the totals."""
    summary = dict(meta)
    summary.update({
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "this_invocation_s": round(time.perf_counter() - t_all, 3),
        "total_wall_time_s": round(sum(r["wall_time_s"] for r in rows), 3),
        "complete": all(r["status"] in DONE for r in rows),
        "experiments": rows})
    safe_io.write_json(path, summary)
    return summary


def _short_commit(commit):
    """'abc123def456' or 'abc123def456-dirty' (12 hex digits) for the table."""
    return "-" if not commit else commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def print_table(summary):
    """The summary as a plain-text table."""
    rows = summary["experiments"]
    cols = [("experiment", lambda r: r["name"]), ("status", lambda r: r["status"]),
            ("wall", lambda r: fmt(r["wall_time_s"])), ("mode", lambda r: r["mode"] or "-"),
            ("git_commit", lambda r: _short_commit(r["git_commit"])),
            ("interpreter", lambda r: r["interpreter"]), ("results", lambda r: ", ".join(r["results"]) or "-"),
            ("note", lambda r: r.get("note", ""))]
    cells = [[f(r) for _, f in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(cols)]
    print("  ".join(h.ljust(w) for (h, _), w in zip(cols, widths)))
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
    print(f"total {fmt(summary['total_wall_time_s'])} (this invocation {fmt(summary['this_invocation_s'])}); "
          f"summary in {summary['path']}", flush=True)


def finish_row(row, rc, wall, interrupted, written, folder, prev, head):
    """Fill a job's row from its exit code, time and written files (adding an interrupted attempt's time)."""
    mode = row["mode"]
    row.update(describe(written, folder), ran=True, wall_time_s=round(wall, 3))
    row["mode"] = row["mode"] or mode
    row["git_commit"] = row["git_commit"] or head
    if interrupted and rc != 0:          # a script that still finished cleanly during the grace time is ok
        row["status"] = "interrupted"
    else:
        row["status"] = "ok" if rc == 0 else f"failed (exit {rc})"
    if prev.get("status") == "interrupted":
        row["wall_time_s"] = round(wall + prev.get("wall_time_s", 0.0), 3)
        row["note"] = f"includes {fmt(prev.get('wall_time_s', 0.0))} of an interrupted attempt"


def ordered(rows):
    """Rows in the tutorial's order, then the other demos, bench_core and make_figures last."""
    tail = {"bench_core": 2, "make_figures": 3}
    key = {n: i for i, n in enumerate(experiments.scripts())}
    return sorted(rows, key=lambda r: (tail.get(r["name"], 1 if r["name"] not in key else 0),
                                       key.get(r["name"], 0), r["name"]))


class MainJob:
    """One invocation: the jobs to run, the previous summary, and the rows of this one."""

    def __init__(self, args, parser, argv):
        self.args, self.argv = args, argv
        self.mode = "quick" if args.quick else ("extended" if args.extended else "default")
        self.folder = results_dir(args.quick)
        os.makedirs(self.folder, exist_ok=True)
        self.path = os.path.join(self.folder, SUMMARY)
        last = read_json(self.path) or {}
        self.prev = {r["name"]: r for r in last.get("experiments", [])} if last.get("mode") == self.mode else {}
        self.jobs = build_jobs(args, select(parser, args), self.folder)
        self.head = common.git_commit()
        self.env = child_env(args.quick, self.folder)
        names = [n for n, _ in self.jobs]
        # Experiments outside this invocation (--only) keep their row from the last summary of this mode
        # (if it ran), else are listed as 'not run' or 'missing': the summary always lists all of them.
        self.carried = [r for n, r in self.prev.items() if n not in names and r["status"] not in ("missing", "running")]
        kept = set(names) | {r["name"] for r in self.carried}
        self.carried += [new_row(n, [sys.executable, s] if s else None, "not run" if s else "missing", self.mode)
                         for n, s in discover() if n not in kept]
        self.current = {n: is_current(self.prev.get(n), self.folder, self.head, self.mode) if args.resume
                        else (False, "") for n in names}
        others_current = all(c for n, (c, _) in self.current.items() if n != "make_figures")
        if args.resume and "make_figures" in names and others_current:      # then no result will change
            self.current["make_figures"] = figures_current(self.prev.get("make_figures"), self.folder, self.head)
        self.expected = {n: 0.0 if self.current[n][0] else r["wall_time_s"]
                         for n, r in self.prev.items() if r.get("status") in DONE and n in names}
        self.rows, self.t0 = [], time.perf_counter()
        self.meta = {"job": "run_all", "mode": self.mode, "git_commit": self.head, "interpreter": interpreter(),
                     "executable": sys.executable, "cpu_count": os.cpu_count(),
                     "command": ["demos/run_all.py", *argv],
                     "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "path": os.path.relpath(self.path, ROOT) if self.path.startswith(ROOT + os.sep) else self.path}

    def write(self):
        return write_summary(self.path, self.meta, ordered(self.rows + self.carried), self.t0)

    def step(self, i, name, cmd):
        """Run (or skip) job i; raises KeyboardInterrupt after writing the row of an interrupted script."""
        row = new_row(name, cmd, "running", self.mode)
        self.rows.append(row)
        line = (f"[run_all] ({i + 1}/{len(self.jobs)}) {name} -- elapsed {fmt(time.perf_counter() - self.t0)}, "
                + eta_text(self.jobs, i, self.expected))
        if cmd is None:
            row["status"] = "missing"
            print(f"{line}: MISSING (no {row['script']}); skipped", flush=True)
            return
        current, why = self.current[name]
        if name == "make_figures" and self.args.resume:          # now: the experiments before it may have run
            current, why = figures_current(self.prev.get(name), self.folder, self.head)
        if name == "make_figures":
            row["inputs"] = results_fingerprint(self.folder)
        if current:
            keep = ("wall_time_s", "results", "git_commit", "interpreter", "mode", "config_hash", "inputs")
            row.update({k: self.prev[name].get(k) for k in keep}, status="current",
                       note="results current; skipped by --resume")
            print(f"{line}: current ({', '.join(row['results']) or 'drawn from these results'}); skipped", flush=True)
            return
        print(line + (f" (not current: {why})" if self.args.resume else ""), flush=True)
        if why.startswith("data changed"):
            drop_stale_checkpoints(self.prev.get(name, {}), self.folder)
        self.write()                                   # a job killed outright shows up as 'running'
        before = snapshot(self.folder)
        rc, wall, interrupted = run_job(cmd, self.env)
        written = [f for f, m in snapshot(self.folder).items() if before.get(f) != m]
        finish_row(row, rc, wall, interrupted, written, self.folder, self.prev.get(name, {}), self.head)
        self.write()
        if interrupted:
            raise KeyboardInterrupt
        print(f"[run_all] {name}: {row['status']} in {fmt(wall)}", flush=True)
        if rc != 0:
            print(f"[run_all] {name} failed with exit code {rc}; continuing", flush=True)

    def run(self):
        """Every job in order; returns the exit code."""
        if self.args.resume and self.head.endswith("-dirty"):
            print("[run_all] --resume: the working tree has uncommitted changes, so no result counts as current",
                  flush=True)
        print(f"[run_all] {len(self.jobs)} jobs ({self.mode}) with {sys.executable}; results in "
              f"{self.folder}: {', '.join(n for n, _ in self.jobs)}", flush=True)
        rc_all = 0
        try:
            for i, (name, cmd) in enumerate(self.jobs):
                self.step(i, name, cmd)
        except KeyboardInterrupt:
            rc_all = 130
            if self.rows and self.rows[-1]["status"] == "running":
                self.rows[-1]["status"] = "interrupted"
            self.rows += [new_row(n, c, "not run", self.mode) for n, c in self.jobs[len(self.rows):]]
        if rc_all == 0 and self.rows and all(r["status"] == "current" for r in self.rows):
            print(f"[run_all] everything is current (same commit, mode and configuration; figures made from these "
                  f"results): nothing ran, {os.path.relpath(self.path)} left as it was", flush=True)
            return 0
        summary = self.write()
        print(f"\n[run_all] summary ({self.mode})")
        print_table(summary)
        return report(summary, self.rows, rc_all, self.argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser, args = parse_args(argv)
    lock_env = common.hold_or_exit(results_dir(args.quick), "run_all")   # one run per results folder, or exit 2
    job = MainJob(args, parser, argv)
    job.env.update(lock_env)                                   # the scripts it starts write under its lock
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started with SIGINT ignored
    common.exit_130_on_ctrl_c()                                # a Ctrl-C outside a job: 130, no traceback
    return job.run()


def report(summary, rows, rc_all, argv):
    """Closing lines and the exit code."""
    missing = [r["name"] for r in rows if r["status"] == "missing"]
    failed = [r["name"] for r in rows if r["status"].startswith("failed")]
    if missing:
        print(f"[run_all] {len(missing)} missing script(s): {', '.join(missing)}")
    if failed:
        print(f"[run_all] {len(failed)} failed: {', '.join(failed)}")
    if rc_all == 130:
        print(f"[run_all] interrupted. Finished experiments are kept and the interrupted one continues from its "
              f"checkpoints. To resume:\n    {resume_command(argv)}", flush=True)
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
