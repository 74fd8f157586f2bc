"""pytest's set-up for this repository (pytest reads it before collecting the tests_*.py files).

* The ``slow`` marker (declared in pyproject.toml): the integration tests of over about 20 s (the
  experiments' QUICK runs, the exhaustive walks of the SMILES constraint).  ``python -m pytest`` leaves
  them out (``-m "not slow"`` in pyproject's addopts); ``python -m pytest -m slow`` runs only them and
  ``make test`` runs both.  When slow tests were left out, the summary says how to run them.
* Third-party warnings: the one list of warnings raised inside other packages that this project cannot
  fix is ``demos/common.py``'s THIRD_PARTY_WARNINGS; it is added to pytest's filterwarnings here, so the
  warning summary shows only what this project's code raises.
* ``--record-tests PATH`` writes the counts of the session (passed, failed, skipped, errors, deselected),
  its wall and CPU time, the marker expression, the host's load and the 25 tests that took the most CPU time (wall
  and CPU seconds each: CPU time does not stretch on a busy host) to PATH as JSON (``safe_io.write_json``);
  ``make test`` records both of its runs, and ``make_figures.py --readme`` renders them in the README.
"""
import datetime
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "demos"))

import common  # noqa: E402  (demos/common.py: THIRD_PARTY_WARNINGS, git_commit)
import pytest  # noqa: E402  (imported after the sys.path set-up above)
import safe_io  # noqa: E402  (imported after the sys.path set-up above)

_START = {}
_TIMES = {}          # node id -> (wall seconds, CPU seconds)


def pytest_addoption(parser):
    parser.addoption("--record-tests", default=None, metavar="PATH",
                     help="write this session's counts, wall time and host load to PATH (JSON)")


def pytest_configure(config):
    for spec in common.third_party_warning_specs():
        config.addinivalue_line("filterwarnings", spec)


def pytest_sessionstart(session):
    _START.update(t=time.perf_counter(), cpu=_cpu_seconds(), load=_load(), slow_left_out=0)


def _cpu_seconds():
    """User + system CPU seconds of this process and of its finished children (subprocesses, workers)."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's wall time and CPU time (setup, call and teardown): on a busy host the wall time stretches
    and the CPU time does not, so the record says which tests are slow in themselves."""
    t0, c0 = time.perf_counter(), _cpu_seconds()
    yield
    _TIMES[item.nodeid] = (time.perf_counter() - t0, _cpu_seconds() - c0)


def pytest_deselected(items):
    """Count the slow tests that -m (or -k) left out, for the closing hint."""
    _START["slow_left_out"] = _START.get("slow_left_out", 0) + sum(
        1 for item in items if item.get_closest_marker("slow"))


def _load():
    """The 1-minute load average (None where the OS has none): a wall time means little without it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _counts(stats):
    """{outcome: number} as pytest's own closing line counts them, from the terminal reporter's stats."""
    names = {"passed": "passed", "failed": "failed", "skipped": "skipped", "error": "errors",
             "xfailed": "xfailed", "xpassed": "xpassed", "deselected": "deselected"}
    return {out: len(stats.get(key, [])) for key, out in names.items()}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say how to run the slow tests when they were left out; write --record-tests' file."""
    stats = terminalreporter.stats
    markexpr = config.getoption("markexpr") or ""
    slow = _START.get("slow_left_out", 0)
    if slow:
        terminalreporter.write_line(f"{slow} slow test(s) left out: add `-m slow` to run them, `-m ''` to run "
                                    f"everything (`make test` runs both sets)")
    path = config.getoption("record_tests")
    if not path:
        return
    args = config.invocation_params.args
    record = {"selection": markexpr or "all", "command": " ".join(["python -m pytest", *args]),
              **_counts(stats), "exit_status": int(exitstatus),
              "wall_time_s": round(time.perf_counter() - _START.get("t", time.perf_counter()), 1),
              "cpu_time_s": round(_cpu_seconds() - _START.get("cpu", 0.0), 1),
              "load_average_1min": {"start": _START.get("load"), "end": _load()},
              "cpu_count": os.cpu_count(), "python": platform.python_version(),
              "implementation": platform.python_implementation(), "git_commit": common.git_commit(),
              "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "slowest_by_cpu": [{"test": k, "wall_s": round(w, 1), "cpu_s": round(c, 1)} for k, (w, c) in
                                 sorted(_TIMES.items(), key=lambda kv: -kv[1][1])[:25]]}
    safe_io.write_json(path, record)
    terminalreporter.write_line(f"counts and wall time written to {path}")
