"""The README's "tests" block (in "How we know the gradients are right"), from the two files ``make test``
writes: figures/tests_fast.json (``python -m pytest``, every test not marked slow) and
figures/tests_slow.json (``python -m pytest -m slow``).  conftest.py's ``--record-tests`` writes them;
every number in the block is read from them.

    import suite_counts
    text = suite_counts.tests_block("figures")     # Markdown, between the README's tests markers
"""
import json
import os

RUNS = (("fast", "`python -m pytest` (not slow)"), ("slow", "`python -m pytest -m slow`"))


def _read(folder, kind):
    """The parsed tests_<kind>.json of folder, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(folder, f"tests_{kind}.json"), encoding="utf-8") as f:
            payload = json.load(f)
        return payload if isinstance(payload, dict) else None
    except (OSError, ValueError):
        return None


def _load_text(r):
    """'0.4 → 1.2 (quiet)': a record's 1-minute load averages at its start and end, 'busy' when either is
    above the number of cores (more runnable processes than cores: every wall time stretches)."""
    load = r.get("load_average_1min") or {}
    start, end = load.get("start"), load.get("end")
    if start is None or end is None:
        return "–"
    word = "busy" if max(start, end) > r["cpu_count"] else "quiet"
    return f"{start:.1f} → {end:.1f} ({word})"


def _row(label, r):
    wall = f"{r['wall_time_s'] / 60:.1f} min" + (f" (CPU {r['cpu_time_s'] / 60:.1f} min)" if "cpu_time_s" in r else "")
    return (f"| {label} | {r['passed']} | {r['failed'] + r['errors']} | {r['skipped']} | {r['deselected']} | "
            f"{wall} | {_load_text(r)} | {r['implementation']} {r['python']}, {r['cpu_count']} cores, "
            f"`{str(r['git_commit'])[:12]}` |")


def tests_block(folder):
    """Markdown for the README's tests block from ``folder``'s tests_fast.json and tests_slow.json: one row
    per run (its counts, wall time and, where recorded, CPU time (user + system, the child processes
    included: a busy host stretches the wall time, not this), the host's 1-minute load average at its start and end,
    'busy' when above the number of cores, and where it ran)."""
    runs = [(label, _read(folder, kind)) for kind, label in RUNS]
    if not any(r for _, r in runs):
        return "_No recorded run yet: `make test` writes `figures/tests_fast.json` and `figures/tests_slow.json`._"
    lines = ["| `make test` (figures/tests_*.json) | passed | failed | skipped | left out | wall time "
             "| load average, start → end (busy: above the cores) | run on |",
             "|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [_row(label, r) if r else f"| {label} | not recorded yet ||||||" for label, r in runs])
