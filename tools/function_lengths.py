"""List the longest functions (and methods) of the project's Python files.

    python tools/function_lengths.py              # every function over 60 lines, longest first
    python tools/function_lengths.py --top 15     # the 15 longest, whatever their length
    python tools/function_lengths.py --limit 50   # every function over 50 lines

A function's length is its line span in the source (``def`` line through its last line, docstring and
comments included), as ``ast`` reports it.  Exit status 1 when any function is over the limit and
--top is not given, so the check can run in a test.
"""
import argparse
import ast
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["*.py", "demos/*.py", "tools/*.py"]        # every module of the project but the tests (tests_*.py)
LIMIT = 60


def project_files(root=ROOT):
    """The files the line limit applies to, relative to root."""
    out = []
    for pattern in FILES:
        out += sorted(p for p in glob.glob(os.path.join(root, pattern)) if not os.path.basename(p).startswith("tests_"))
    return [os.path.relpath(p, root) for p in out]


def function_lengths(path):
    """[(lines, 'file:line name')] for every function and method in one file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.end_lineno - node.lineno + 1, f"{path}:{node.lineno} {node.name}"))
    return out


def all_lengths(root=ROOT):
    """Every function of every project file, longest first."""
    rows = []
    for rel in project_files(root):
        rows += [(n, where.replace(os.path.join(root, ""), ""))
                 for n, where in function_lengths(os.path.join(root, rel))]
    return sorted(rows, reverse=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--limit", type=int, default=LIMIT, help=f"longest allowed function (default {LIMIT})")
    p.add_argument("--top", type=int, default=None, help="print the N longest functions instead")
    a = p.parse_args(argv)
    rows = all_lengths()
    shown = rows[:a.top] if a.top else [r for r in rows if r[0] > a.limit]
    for n, where in shown:
        print(f"{n:5d}  {where}")
    if a.top is None:
        print(f"{len(shown)} function(s) over {a.limit} lines")
        return 1 if shown else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
