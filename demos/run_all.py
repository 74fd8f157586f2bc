"""The main job: run every experiment script, each in its own process, then make_figures.py.

    python demos/run_all.py                 # full runs -> figures/results_*.json, figures, README tables
    python demos/run_all.py --quick         # QUICK=1 for every script -> figures/quick/
    python demos/run_all.py --only positional,dropout
    python demos/run_all.py --bench         # also demos/bench_core.py (speed table in the README)

A failing experiment is reported and the others still run; the summary table at the end lists
experiment, status, wall time and results file, and the exit code is 0 only if everything passed.
"""
import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The tutorial's order; scripts not listed here but present as demos/demo_*.py run afterwards.
ORDER = ["attention_basics", "positional", "length_generalization", "smiles_lm", "attention_chem",
         "deepchem_esol", "deepchem_materials", "deepchem_hopv", "reaction_seq2seq", "tokenization", "dropout"]


def discover():
    """Experiment names (demo_<name>.py) that exist, in ORDER first, then alphabetically."""
    present = sorted(os.path.basename(p)[5:-3] for p in glob.glob(os.path.join(HERE, "demo_*.py")))
    return [n for n in ORDER if n in present] + [n for n in present if n not in ORDER]


def snapshot(folder):
    """{path: modification time} of the JSON files in folder (to see which ones a job wrote)."""
    return {f: os.stat(f).st_mtime_ns for f in glob.glob(os.path.join(folder, "*.json"))}


def fmt(seconds):
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s"


def run_one(cmd, env):
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    except KeyboardInterrupt:
        raise
    except OSError as e:
        print(f"[run_all] could not start {cmd}: {e}", flush=True)
        rc = 127
    return rc, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="QUICK=1 for every script (results in figures/quick/)")
    p.add_argument("--only", action="append", default=[],
                   help="run only these experiments (comma-separated names, e.g. positional,dropout)")
    p.add_argument("--bench", action="store_true", help="also run demos/bench_core.py")
    p.add_argument("--no-figures", action="store_true", help="skip make_figures.py")
    args = p.parse_args()

    names = discover()
    if args.only:
        wanted = [w.strip() for arg in args.only for w in arg.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            p.error(f"unknown experiment(s) {unknown}; available: {', '.join(names)}")
        names = [n for n in names if n in wanted]
    env = dict(os.environ)
    if args.quick:
        env["QUICK"] = "1"
    else:
        env.pop("QUICK", None)
    out_dir = os.path.join(ROOT, "figures", "quick") if args.quick else os.path.join(ROOT, "figures")
    jobs = [(n, [sys.executable, os.path.join(HERE, f"demo_{n}.py")]) for n in names]
    if args.bench:
        jobs.append(("bench_core", [sys.executable, os.path.join(HERE, "bench_core.py")]))
    if not args.no_figures:
        fig_cmd = [sys.executable, os.path.join(ROOT, "make_figures.py"), "--dir", out_dir]
        if not args.quick:
            fig_cmd.append("--readme")
        jobs.append(("make_figures", fig_cmd))

    print(f"[run_all] {len(jobs)} jobs ({'QUICK' if args.quick else 'full'}) with {sys.executable}: "
          f"{', '.join(j[0] for j in jobs)}", flush=True)
    rows = []
    t_all = time.perf_counter()
    for i, (name, cmd) in enumerate(jobs, 1):
        print(f"\n[run_all] ({i}/{len(jobs)}) {name} -- elapsed {fmt(time.perf_counter() - t_all)}", flush=True)
        before = snapshot(out_dir)
        rc, wall = run_one(cmd, env)
        after = snapshot(out_dir)
        written = sorted(os.path.relpath(f, ROOT) for f, m in after.items() if before.get(f) != m)
        rows.append((name, "ok" if rc == 0 else f"FAILED (exit {rc})", wall, ", ".join(written) or "-"))
        if rc != 0:
            print(f"[run_all] {name} failed with exit code {rc}; continuing", flush=True)

    w = max([len("experiment")] + [len(r[0]) for r in rows])
    print(f"\n[run_all] summary ({fmt(time.perf_counter() - t_all)} in all)")
    print(f"{'experiment':<{w}}  {'status':<16}  {'wall':>7}  results")
    for name, status, wall, files in rows:
        print(f"{name:<{w}}  {status:<16}  {fmt(wall):>7}  {files}")
    failed = [r[0] for r in rows if r[1] != "ok"]
    if failed:
        print(f"[run_all] {len(failed)} failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
