"""Compare two folders of results_*.json: every number and string must agree, except the fields that
measure the machine or the moment rather than the model (wall times, speeds, host speed, load, timestamps,
git_commit).

    python tools/compare_results.py BEFORE_DIR AFTER_DIR      # exit 0 when every shared file agrees
    python tools/compare_results.py A B --names esol,hopv     # only results_esol.json, results_hopv.json

Made for refactors that must change no number: run the QUICK experiments before and after
(``RESULTS_DIR=/tmp/before python demos/run_all.py --quick`` at the old commit, the same into
/tmp/after at the new one) and compare the folders.  A field is volatile (ignored) when a word of its key is in
VOLATILE_WORDS (time, speed, dates, commit, paths of the results folder), it ends in _s or _ms (a duration)
or holds _s_per_ / _ms_per_ (a duration per item),
or it is one of VOLATILE_KEYS (timing repeats, power laws fitted to measured times) or MACHINE_FIELDS (what
the host measured about itself: its matmul speed, its load, timed steps), or its JSON path is one of
VOLATILE_PATHS (a path that names the results folder).  Two floats agree when they are equal to a
relative tolerance of REL_TOL (1e-12: summation order in a library, e.g. GuacaMol's KL score, moves the last
bits between runs); integers, strings, booleans and the shapes of lists and dicts must be equal exactly.
Prints each difference as a JSON path with both values; exit 1 if any.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

# a key is volatile when one of its snake_case words is here, or it ends in _s / _ms (a duration)
VOLATILE_WORDS = {"time", "times", "wall", "seconds", "elapsed", "speedup", "throughput", "started",
                  "utc", "date", "git", "commit", "platform", "path", "dir", "eta"}
# ... and these whole keys: experiment 1's timing repeats and the power laws fitted to its measured times
VOLATILE_KEYS = {"cost_fit", "qk_repeats", "mha_repeats", "min_repeats", "max_repeats", "model_file"}
# ... and what the host measured about itself (not the model's numbers)
MACHINE_FIELDS = {"matmul_mflops": "the host's transformer.matmul speed at a run's start and end",
                  "naive_mflops": "the host's naive triple-loop speed",
                  "load_average_1min": "the host's 1-minute load while a study timed itself",
                  "cpu_count": "the host's core count",
                  "pure_python_s_per_step": "seconds per optimiser step, timed (the PyTorch study)",
                  "torch64_s_per_step": "seconds per optimiser step, timed (the PyTorch study)",
                  "torch32_s_per_step": "seconds per optimiser step, timed (the PyTorch study)",
                  "ratio64": "a ratio of two timed speeds (the PyTorch study)",
                  "ratio32": "a ratio of two timed speeds (the PyTorch study)"}
# ... and these paths, which name the results folder the run wrote into
VOLATILE_PATHS = {"$.results.ngram.source": "experiment 5's path to experiment 4's results, relative to the checkout"}
REL_TOL = 1e-12     # floats agree to this relative tolerance


def volatile(key):
    """True for a key whose value depends on the machine or the run's moment, not on the computation."""
    key = str(key).lower()
    return (key in VOLATILE_KEYS or key in MACHINE_FIELDS or key.endswith(("_s", "_ms"))
            or re.search(r"_m?s_per_", key) is not None                 # a duration per item (s_per_input)
            or any(w in VOLATILE_WORDS for w in re.split(r"[_\W]+", key)))


def same_value(a, b):
    """Equal, NaN equal to NaN, and two floats equal to REL_TOL (an int and a float compare as numbers)."""
    if a == b or (a != a and b != b):
        return True
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return (isinstance(a, float) or isinstance(b, float)) and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    return False


def diff(a, b, path="$", out=None, limit=50):
    """Differences between two JSON values as [(path, a, b)], skipping volatile keys and paths."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if volatile(k) or f"{path}.{k}" in VOLATILE_PATHS:
                continue
            if k not in a or k not in b:
                out.append((f"{path}.{k}", a.get(k, "<missing>"), b.get(k, "<missing>")))
            else:
                diff(a[k], b[k], f"{path}.{k}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append((f"{path}[len]", len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out, limit)
    elif not same_value(a, b):
        out.append((path, a, b))
    return out


def compare_folders(before, after, names=None):
    """{file name: [(path, before, after)]} over the results files both folders hold, plus the files
    only one of them has (as a single difference each)."""
    def files(folder):
        return {os.path.basename(p): p for p in glob.glob(os.path.join(folder, "results_*.json"))}
    fa, fb = files(before), files(after)
    if names:
        keep = {f"results_{n}.json" for n in names}
        fa = {k: v for k, v in fa.items() if k in keep}
        fb = {k: v for k, v in fb.items() if k in keep}
    report = {}
    for name in sorted(set(fa) | set(fb)):
        if name not in fa or name not in fb:
            report[name] = [("$", "present" if name in fa else "<missing>", "present" if name in fb else "<missing>")]
            continue
        with open(fa[name]) as f1, open(fb[name]) as f2:
            report[name] = diff(json.load(f1), json.load(f2))
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--names", default="", help="comma-separated results names (default: every file)")
    a = p.parse_args(argv)
    report = compare_folders(a.before, a.after, [n for n in a.names.split(",") if n] or None)
    bad = 0
    for name, diffs in report.items():
        print(f"{'identical' if not diffs else 'DIFFERENT'}  {name}")
        for path, x, y in diffs:
            print(f"    {path}: {str(x)[:120]!s}  ->  {str(y)[:120]!s}")
        bad += bool(diffs)
    print(f"{len(report) - bad} of {len(report)} results files identical (volatile and machine fields ignored, "
          f"floats to a relative {REL_TOL:g})")
    return 1 if bad or not report else 0


if __name__ == "__main__":
    sys.exit(main())
