"""The kit every study report (demos/report_<script>.py) is built with: plotting set-up and atomic figure
files, number formatting, Markdown tables and line wrapping, the comparison wording several studies share,
the provenance line, the page of a study (docs/<page>.md) and the README's overview table.

    import report_kit as kit
    plt = kit.plt()                                   # matplotlib, Agg backend, the project's style
    paths = kit.save(fig, out_dir, "attention_scaling")   # PNG + SVG through safe_io.atomic_write

Every report module exposes the same interface, which make_figures.py calls:

QUESTION            the study's question and the tutorial's answer (one short paragraph, Markdown)
FIGURES             [fn(payload, results, out_dir) -> written paths], its figure functions
page(payload)       -> Page(comparison, reading, differences, extras, figures): the parts of its page
reading(results)    -> [bullet, ...]: the reading, at most six bullets, each with its number and verdict
headline(results)   -> (ours, the tutorial's): its row of the overview table

``render_page`` puts the parts in the same order on every page: the question, the like-for-like table
(the tutorial's numbers beside ours), the reading, the differences from the tutorial, what goes beyond the
tutorial, the figures, and the provenance (commit, interpreter, host speed, wall time).  Prose lines are
wrapped at WRAP characters (Markdown joins them again); table lines are kept whole.

matplotlib is imported inside the plotting functions only, so a demo can import its report module (for
its reading) without it; the rest is the standard library and safe_io.
"""
import glob
import io
import json
import os
import re
import sys
import textwrap
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIG_DIR = os.path.join(ROOT, "figures")
DOCS_DIR = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from safe_io import atomic_write  # noqa: E402  (imported after the sys.path set-up above)
import evaluation  # noqa: E402  (wilson_interval: a sampled rate's interval)

WRAP = 110                  # prose lines of a generated page are wrapped at this many characters
MAX_LINE = 300              # no generated line may be longer (tests/tests_pages.py checks every page)
PAGE_COMMAND = "python make_figures.py --readme"

# ----------------------------------------------------------------------------- plotting
# Every figure carries the run's git commit in small print (commit_stamp, or corner_stamp for the
# experiment 9 family) and the tutorial's numbers as black "x" markers (ref_mark) where the tutorial has
# a number for the plotted quantity.


def plt():
    """matplotlib.pyplot with the Agg backend and the project's style (SVG ids from a fixed salt)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    pyplot.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10,
                            "axes.labelsize": 9, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
                            "axes.spines.top": False, "axes.spines.right": False, "lines.linewidth": 1.6,
                            "lines.markersize": 4.5, "svg.hashsalt": "chem-transformer"})
    return pyplot


def figure_bytes(fig, ext, **kw):
    """The figure rendered to an in-memory file: PNG or SVG bytes (SVG without a date, so reruns match)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=ext, metadata={"Date": None} if ext == "svg" else None, **kw)
    return buf.getvalue()


def save(fig, out_dir, name, meta=None):
    """Write name.png and name.svg atomically (rendered in memory, then ``safe_io.atomic_write``) and
    close the figure; returns the two paths.  ``meta``: a results payload's meta, stamped first (``commit_stamp``)."""
    if meta is not None:
        commit_stamp(fig, meta)
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        atomic_write(path, figure_bytes(fig, ext, bbox_inches="tight"))
        paths.append(path)
    plt().close(fig)
    return paths


def subtitle(meta):
    """'QUICK run, Python 3.11.7, seed 0, 27 s' of a results payload."""
    return (f"{'QUICK run, ' if meta.get('quick') else ''}Python {meta.get('python', '?')}, "
            f"seed {meta.get('seed', '?')}, {meta.get('wall_time_s', 0):.0f} s")


def commit_stamp(fig, meta):
    """The git commit the results came from, in small print at the top left."""
    fig.text(0.003, 0.997, f"git {meta.get('git_commit') or 'unknown'}", ha="left", va="top",
             fontsize=5.5, color="gray")


def corner_stamp(fig, meta):
    """The commit the results came from (12 characters), in small print at the bottom right."""
    fig.text(0.995, 0.003, f"git {str(meta.get('git_commit', '?'))[:12]}", ha="right", va="bottom",
             fontsize=6, color="gray")


def ref_mark(ax, xs, ys, label="tutorial (reference)", color="k", ms=6):
    """The tutorial's values as 'x' markers (points whose value is None are skipped)."""
    pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if pts:
        ax.plot(*zip(*pts), linestyle="none", marker="x", color=color, ms=ms, mew=1.3, label=label)


def legend_below(ax, ncol=2):
    """A legend under the axes, where it cannot hide data."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=ncol, fontsize=7, frameon=False)


# ----------------------------------------------------------------------------- numbers and words


def fmt(x, spec=".3f"):
    """x formatted by ``spec``, '–' for None."""
    return "–" if x is None else format(x, spec)


def rate_ci(k, n, spec=".3f"):
    """A sampled rate k / n with its 95 % Wilson interval (evaluation.wilson_interval), e.g. '0.415 [0.349,
    0.484]'; '–' when n is 0.  Where the n is not the table's, the caller writes it beside."""
    if not n:
        return "–"
    lo, hi = evaluation.wilson_interval(k, n)
    return f"{format(k / n, spec)} [{format(lo, spec)}, {format(hi, spec)}]"


def share_ci(share, n, pct=False):
    """A stored share of n items (a forced, closed or long share) as a rate with its 95 % Wilson interval, from
    its count round(share * n); in per cent with ``pct`` ('0.5% [0.4, 0.7]'); '–' when absent."""
    if share is None or not n:
        return "–"
    k = round(share * n)
    if not pct:
        return rate_ci(k, n)
    lo, hi = evaluation.wilson_interval(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def inside_word(ref, k, n):
    """Whether a reference rate lies inside the 95 % Wilson interval of k / n: 'inside' or 'outside'."""
    lo, hi = evaluation.wilson_interval(k, n)
    return "inside" if lo <= ref <= hi else "outside"


def against_ours(ref, k, n, ref_n):
    """Where a reference rate lies against ours (k / n): 'inside ours', or 'outside ours' and whether the
    reference's own 95 % Wilson interval over its ``ref_n`` items overlaps ours (two overlapping intervals: no
    difference shown, only a different point)."""
    word = inside_word(ref, k, n)
    if word == "inside":
        return "inside ours"
    lo, hi = evaluation.wilson_interval(round(ref * ref_n), ref_n)
    mine = evaluation.wilson_interval(k, n)
    overlap = "overlaps" if lo <= mine[1] and mine[0] <= hi else "does not overlap"
    return f"outside ours; its own interval over {ref_n}, [{lo:.3f}, {hi:.3f}], {overlap} ours"


def valid_ci(m):
    """A decoding metrics block's RDKit validity of the top-1 ({'valid': share, 'n': test reactions}) with its
    95 % Wilson interval over the n test reactions (the decoding is deterministic: the test reactions are the
    sample): '0.140 [0.093, 0.205]'; '–' without a validity."""
    return "–" if m.get("valid") is None else rate_ci(round(m["valid"] * m["n"]), m["n"])


def fmt_e(x):
    """x as '1.2e-05', '–' for None."""
    return "–" if x is None else f"{x:.1e}"


def mean_sd(values):
    """(mean, sample standard deviation; 0.0 for a single value)."""
    m = sum(values) / len(values)
    return m, (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0


def mean_cell(vals, f=".3f", pct=False, sd=True, pm=" ± "):
    """'mean ± sd' of per-seed values (the mean alone with one seed, or without ``sd``; in whole per cent with
    ``pct``: '25±1%'); None when any seed lacks the value."""
    if not vals or None in vals:
        return None
    m, s = mean_sd(list(vals))
    if pct:
        return f"{100 * m:.0f}" + (f"±{100 * s:.0f}" if sd and len(vals) > 1 else "") + "%"
    return f"{m:{f}}" + (f"{pm}{s:{f}}" if sd and len(vals) > 1 else "")


def minutes(seconds):
    """'45 s' under 90 seconds, else '2.5 min'."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def seeds_word(n):
    """'1 seed' / '3 seeds'."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def sentence(text):
    """text with its first letter in upper case and a full stop (the rest untouched)."""
    return (text[:1].upper() + text[1:] + ".") if text else ""


def and_join(items):
    """'a, b and c'."""
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + (items[-1] if items else "")


def table(header, rows):
    """Markdown table lines: the header cells, the rule, one line per row of cells."""
    return (["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


# ----------------------------------------------------------------------------- comparison wording
# The rule of every reading (each part has the code that enforces it, below):
# 1. A number set beside a tutorial number is the same statistic over the same items: a row that sets ours
#    beside the tutorial's is built by ``beside(Stat(...), Stat(...))``, which refuses two Stats whose
#    statistic or items differ (UnlikeComparisonError).  The tutorial's items are not ours (its own draws,
#    its own 150 reactions), so "the same items" there means the same kind and number of items.
# 2. A comparison called "paired" pairs the same items: per-item scores are paired by ``scored_pairs``,
#    which refuses two unequal item lists (UnpairedComparisonError) and keeps the items BOTH sides score, so
#    a mean "over valid predictions" is paired over the items valid on both sides, never one side's valid
#    items against the other's all; the record then names those items (``items``) and each side's mean.
# 3. Every "level", "better", "beats", "best" names its test: ``judged(verdict, test)`` refuses a verdict
#    without one.
# results.comparisons records (experiments 6-9): {split, a, b, metric, diff, ci_low, ci_high, verdict,
# n_items, ...}, a paired bootstrap of A − B over the same test items; "lower"/"higher" only when the gap
# exceeds the seed spread AND the 95 % interval excludes 0.


class UnlikeComparisonError(ValueError):
    """Two numbers set side by side that are not the same statistic over the same items."""


class UnpairedComparisonError(ValueError):
    """A comparison called paired whose two sides are not over the same items."""


Stat = namedtuple("Stat", ["text", "statistic", "items"])
Stat.__doc__ = """A number as set in a table: its ``text``, the ``statistic`` it is, the ``items`` it is over."""


def beside(ours, ref):
    """(ours.text, ref.text) of two Stats that are the same statistic over the same items; else
    UnlikeComparisonError naming both (rule 1)."""
    for field in ("statistic", "items"):
        if getattr(ours, field) != getattr(ref, field):
            raise UnlikeComparisonError(f"not like for like: ours is {field} {getattr(ours, field)!r}, the "
                                        f"tutorial's {getattr(ref, field)!r}")
    return ours.text, ref.text


def same_items(items_a, items_b):
    """items_a when the two item lists are identical (same items, same order); else UnpairedComparisonError
    naming the lengths and the first position where they differ (rule 2)."""
    items_a, items_b = list(items_a), list(items_b)
    if items_a != items_b:
        k = next((i for i, (x, y) in enumerate(zip(items_a, items_b)) if x != y), min(len(items_a), len(items_b)))
        at = (f"item {k}: {items_a[k]!r} against {items_b[k]!r}" if k < min(len(items_a), len(items_b))
              else f"item {k} is on one side only")
        raise UnpairedComparisonError(f"not paired: {len(items_a)} items against {len(items_b)}, first difference "
                                      f"at {at}")
    return items_a


def scored_pairs(items_a, values_a, items_b, values_b):
    """(items, a, b): the per-item scores of two methods over the same items (``same_items``), kept where
    BOTH score an item (None: not scored, e.g. an invalid prediction under "mean over valid"), so a mean
    on each side is over the same items (rule 2).  Unequal lengths of items and values raise ValueError."""
    items = same_items(items_a, items_b)
    for name, vals in (("a", values_a), ("b", values_b)):
        if len(vals) != len(items):
            raise ValueError(f"scored_pairs: {len(items)} items but {len(vals)} values on side {name}")
    kept = [(i, x, y) for i, x, y in zip(items, values_a, values_b) if x is not None and y is not None]
    return [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]


def judged(verdict, test):
    """'<verdict> (<test>)': a verdict such as 'level with' or 'best' with the test that decided it; an
    empty test raises ValueError (rule 3)."""
    if not str(test).strip():
        raise ValueError(f"judged: the verdict {verdict!r} names no test")
    return f"{verdict} ({test})"


VERDICT_WORDS = {"lower": "lower than", "higher": "higher than", "level": "level with"}

ONE_SEED_WORDS = {"lower": "below, by the paired interval alone,", "higher": "above, by the paired interval alone,"}
"""A 1-seed-against-1-seed comparison's words: its seed-spread half is vacuous (spread 0), so it is never
'lower than' (better) outright; ``ONE_SEED_NOTE`` says why."""

ONE_SEED_NOTE = "one seed: not judged against the seed spread"

LEVEL_MEANING = ("*Level* on this page means no difference detected (the paired interval includes 0, or the gap is "
                 "within the seed spread, max − min of the per-seed values), not \"as good as\".")
"""Said once on every page whose reading or tables use 'level' (``render_page``)."""


LEVEL_VERDICT = re.compile(r"(?<![-\w])level(?= with\b| or\b|[;:,.)])")
"""'level' as a verdict ('level with', 'paired test: level;'), not 'atom-level' or 'at rounding level ('."""


def one_seed(c):
    """True when a comparison has one seed on each side: the seed-spread half of its rule is vacuous."""
    return c.get("n_seeds_a") == c.get("n_seeds_b") == 1


def verdict_words(c):
    """'lower than' / 'higher than' / 'level with' of a comparison record; a one-seed verdict other than level
    says it rests on the paired interval alone (``ONE_SEED_WORDS``)."""
    if one_seed(c) and c["verdict"] != "level":
        return ONE_SEED_WORDS[c["verdict"]]
    return VERDICT_WORDS[c["verdict"]]


def verdict_cause(c, r=None):
    """'; …' after a comparison's interval: which rule made a verdict level (the interval first, else the
    seed spread); a 1-seed-against-1-seed verdict says it was not judged against the seed spread (the rule's
    half that is vacuous there).  ``r`` is accepted for the callers' sake and not needed."""
    if c["verdict"] == "level":
        return ("; interval includes 0" if c.get("ci_verdict", "level") == "level" else
                f"; the interval excludes 0, but the gap is within the seed spread {c['seed_spread']:.3f}")
    if one_seed(c):
        return "; " + ONE_SEED_NOTE
    return ""


def paired_word(p, spread):
    """A paired interval's verdict (``p``: {diff, ci_low, ci_high}) under the house rule: 'below' (diff < 0) or
    'above' where the interval excludes 0 and the gap is beyond the seed spread, else 'level' with the rule that
    made it so (as ``verdict_cause``)."""
    cut = p["ci_high"] < 0 or p["ci_low"] > 0
    if cut and abs(p["diff"]) > spread:
        return "above" if p["diff"] > 0 else "below"
    return ("level (the interval excludes 0, but the gap is within the seed spread " if cut else
            "level (the interval includes 0; the seed spread ") + f"{spread:.3f})"


def find_comparison(r, split, a, b, metric="rmse"):
    """The results.comparisons record of a against b on split (None when it is not there)."""
    return next((c for c in r.get("comparisons", []) if (c["split"], c["a"], c["b"], c["metric"])
                 == (split, a, b, metric)), None)


def cmp_text(c, r=None):
    """('higher than', '(paired Δ +0.012, 95 % CI [+0.001, +0.020]; …)') of one comparison record."""
    why = verdict_cause(c, r)
    return (f"{verdict_words(c)}", f"(paired Δ {c['diff']:+.3f}, 95 % CI [{c['ci_low']:+.3f}, "
                                              f"{c['ci_high']:+.3f}]{why})")


# ----------------------------------------------------------------------------- provenance


def was_resumed(node):
    """True when any run in a results payload continued from a checkpoint an earlier call left
    (``resumed_at_steps`` not empty, or ``resumed`` true): its wall time is then the last call's only."""
    if isinstance(node, dict):
        if node.get("resumed") is True or node.get("resumed_at_steps"):
            return True
        return any(was_resumed(v) for v in node.values())
    return isinstance(node, list) and any(was_resumed(v) for v in node)


def resumed_note(m):
    """The provenance line's note on a resumed run ('' when nothing was resumed)."""
    return (" (the last call of a run resumed from its checkpoints; earlier calls may have run on hosts of "
            "other speeds)") if was_resumed(m.get("results")) or m.get("resumed_stages") else ""


def host_speed(m):
    """' (host matmul N → M Mflop/s; …)': ``transformer.matmul`` at the run's start and end
    (``common.machine_speed``), so a wall time from a slow or busy host reads as such; '' in results that
    predate it."""
    s = m.get("matmul_mflops")
    if not s:
        return ""
    return f" (host matmul {s['start']:.0f} → {s['end']:.0f} Mflop/s; see Speed for this project's reference)"


def updates_note(m, replacing=()):
    """' Then: …' on the calls that updated a results file after its run (``updates``: what each did, from
    which commit, in how long, on how fast a host); '' when there were none.  ``replacing``: the calls (a text in
    their ``what``) that rewrite their rows: an earlier one repeated later is marked replaced."""
    out, ups = [], m.get("updates") or []
    for i, u in enumerate(ups):
        speed = u.get("matmul_mflops") or {}
        host = f", host matmul {speed['start']:.0f} → {speed['end']:.0f} Mflop/s" if speed else ""
        gone = any(k in u["what"] for k in replacing) and any(v["what"] == u["what"] for v in ups[i + 1:])
        out.append(f"{u['what']} (git `{u.get('git_commit') or 'unknown'}`, wall time {u['wall_time_s']:.0f} s{host}"
                   + "; its rows replaced by the later call's" * gone + ")")
    return (" Then: " + "; ".join(out) + ".") if out else ""


def provenance(name, m, module=None):
    """The provenance line of results_<name>.json: mode, interpreter, seed, wall time, host speed, commit, and
    the calls that updated it since (``updates_note``); a run resumed without saying so in the file (see
    ``_wall_cell``) is marked, with its recorded work's lower bound, and so is a resumed run whose module's bound
    is strict (``RECORDED_WALL_STRICT``)."""
    mode = m.get("mode") or ("quick" if m.get("quick") else "default")
    wall = f"wall time {m['wall_time_s']:,.0f} s{host_speed(m)}{resumed_note(m)}"
    if resumed_note(m):                 # listed as resumed: a strict module's bound still gives the whole run
        bound = module.recorded_wall_s(m["results"]) if _strict(module) else None
    else:
        bound = _unlisted_resume(m, m["wall_time_s"], module)
    if bound and bound > m["wall_time_s"]:
        wall = (f"resumed from its checkpoints: the whole run at least {minutes(bound)}"
                " (a lower bound from the job times it records, two at a time: per stage the longer of the longest "
                f"job and half their sum), its last call {m['wall_time_s']:,.0f} s" + (
                    host_speed(m)[:-1] + "; the last call's, earlier calls' not recorded)" if host_speed(m) else ""))
    return (f"`figures/results_{name}.json` — {mode} run, Python {m['python']} ({m['dot_impl']}), seed {m['seed']}, "
            f"{wall}, "
            f"git `{m.get('git_commit') or 'unknown'}`.{updates_note(m, getattr(module, 'REPLACING_UPDATES', ()))}")


# ----------------------------------------------------------------------------- pages

Page = namedtuple("Page", ["comparison", "reading", "differences", "extras", "figures"])
Page.__doc__ = """The parts of a study's page, each a list: ``comparison`` and ``extras`` Markdown lines (tables,
paragraphs, '- ' bullets), ``reading`` and ``differences`` bullet texts, ``figures`` figure names
(figures/<name>.png), or (alt text, name) pairs."""

# a wrapped line must not start with what Markdown would read as a list item, a quote, a heading, a table
# row or a rule: such a word is pulled back onto the line before
MARKDOWN_MARKER = re.compile(r"^(?:[-+*]\s|\d+[.)](?:\s|$)|>|#|\||[-=_*]+\s*$)")


def wrap(text, width=WRAP):
    """text as lines of about ``width`` characters (words never split, so a word longer than the width
    stays whole), no continuation line starting with a Markdown marker."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    i = 1
    while i < len(lines):
        if MARKDOWN_MARKER.match(lines[i]):
            first, _, rest = lines[i].partition(" ")
            lines[i - 1] += " " + first
            if rest:
                lines[i] = rest
            else:
                del lines[i]
            continue
        i += 1
    return lines


def markdown_lines(lines):
    """Lines as written on a page: tables, headings, images and blank lines whole; '- ' bullets and prose
    wrapped (a bullet's continuation lines indented by two spaces)."""
    out = []
    for line in lines:
        if not line.strip() or line.startswith(("|", "#", "![", "<!--")) or len(line) <= WRAP:
            out.append(line)
        elif line.startswith("- "):
            body = wrap(line[2:], WRAP - 2)
            out += ["- " + body[0]] + ["  " + x for x in body[1:]]
        else:
            out += wrap(line)
    return out


def page_path(study, docs_dir=DOCS_DIR):
    """docs/<page>.md of a registry row."""
    return os.path.join(docs_dir, study.page + ".md")


TUTORIAL_FIGURE_NAMES = {"attention_temperature": "fig_a02_temperature.png",
                         "dropout_statistics": "fig_d01_dropout.png",
                         "tokenization_lengths": "fig_t01_tokenization.png"}
"""Our figure -> the file name the tutorial gives the same figure (its reader looks for that name)."""


def _figure_lines(figures):
    out = []
    for f in figures:
        alt, name = f if isinstance(f, tuple) else (f, f)
        out.append(f"![{alt}](../figures/{name}.png)")
        if name in TUTORIAL_FIGURE_NAMES:
            out += ["", f"*`figures/{name}.png` is the tutorial's `{TUTORIAL_FIGURE_NAMES[name]}`.*", ""]
    return out[:-1] if out and out[-1] == "" else out


def _reading_lines(p):
    """The Reading section's lines: ``LEVEL_MEANING`` first when the page says 'level' anywhere, then the
    bullets."""
    text = " ".join(p.comparison + p.reading + p.differences + list(p.extras or []))
    said = LEVEL_VERDICT.search(text) is not None
    return ([LEVEL_MEANING, ""] if said else []) + [f"- {x[:1].upper() + x[1:]}" for x in p.reading]


def render_page(study, module, payload):
    """The whole text of docs/<page>.md for one registry row, its report module and its results payload
    (None: not run yet), in the fixed order of every page."""
    head = [f"<!-- Generated by `{PAGE_COMMAND}` from figures/results_{study.results}.json and "
            f"demos/report_{study.script}.py: edit those, not this file. -->", "", f"# {study.heading}", "",
            f"*What it teaches:* {study.teaches}.", "", module.QUESTION, ""]
    if payload is None:
        body = [f"_Not run yet: `python demos/demo_{study.script}.py` writes `figures/results_{study.results}.json`._"]
    else:
        p = module.page(payload)
        body = (["## The tutorial beside this run", ""] + p.comparison
                + ["", "## Reading", ""] + _reading_lines(p)
                + ["", "## Differences from the tutorial", ""] + [f"- {x}" for x in p.differences]
                + (["", "## Beyond the tutorial", ""] + p.extras if p.extras else [])
                + (["", "## Figures", ""] + _figure_lines(p.figures) if p.figures else [])
                + ["", "## Provenance", "", provenance(study.results, payload, module)])
    tail = ["", "[All studies at a glance](../README.md#all-studies-at-a-glance)"]
    return "\n".join(markdown_lines(head + body + tail)) + "\n"


# ----------------------------------------------------------------------------- the README's overview
# One row per study (demos/experiments.py): what it teaches, its headline number here beside the tutorial's,
# the wall time here (from run_all_summary.json, else the results file) and a link to its page.


def _wall_cell(study, payload, runs, module=None):
    """The wall time of a study: the main job's when it wrote this results file, else the file's own (with
    its mode, interpreter, host speed and resumption when they are not the default run's).  A resumed run's
    own time is its last call's: where the report module has ``recorded_wall_s(results)`` (the sum of the
    stage times the results record, every call's), the cell gives that sum as a lower bound beside it.  Where the
    module says that sum is a strict lower bound of the wall time (``RECORDED_WALL_STRICT``: no two of its parts
    ran at once), a sum above the file's own time shows earlier calls even if the file does not list them."""
    row = next((x for x in runs if x["name"] == study.script), None)
    same_run = (row and row.get("status") in ("ok", "current") and row.get("mode") == payload.get("mode")
                and row.get("git_commit") == payload.get("git_commit"))
    wall = row["wall_time_s"] if same_run else payload.get("wall_time_s")
    if wall is None:
        return "–"
    tags = []
    if not same_run:
        tags += [payload["mode"]] if payload.get("mode", "default") != "default" else []
        tags += [f"Python {payload['python']}"] if not str(payload.get("python", "3.11")).startswith("3.11") else []
        resumed = was_resumed(payload.get("results")) or payload.get("resumed_stages")
        recorded = getattr(module, "recorded_wall_s", None)
        recorded = (recorded(payload["results"]) if recorded and resumed
                    else _unlisted_resume(payload, wall, module))
        resumed = resumed or recorded
        if resumed and recorded:                            # the stages' own times, summed over every call
            how = "resumed" if _strict(module) else "resumed: stages summed"    # strict: '≥' is the bound
            return f"≥ {minutes(recorded)} ({', '.join(tags + [how])})"
        if resumed:                         # the last call's time alone, its host speed not the earlier calls'
            tags += ["resumed: last call"]
        elif payload.get("matmul_mflops"):
            tags += [f"host {payload['matmul_mflops']['start']:.0f} Mflop/s"]
    return minutes(wall) + (f" ({', '.join(tags)})" if tags else "")


def _strict(module):
    return bool(getattr(module, "RECORDED_WALL_STRICT", False))


def _unlisted_resume(payload, wall, module):
    """The module's strict lower bound of the run's wall time where it exceeds ``wall`` (earlier calls did that
    work, though the file does not list them), else None."""
    if not _strict(module):
        return None
    bound = module.recorded_wall_s(payload["results"])
    return bound if bound > wall else None


def overview_row(study, module, payload, runs):
    """One table row: linked title, headline here, tutorial, wall time here (what it teaches is on the page)."""
    title = f"[{study.title}](docs/{study.page}.md)"
    if payload is None:
        return f"| {title} | not run yet (`demos/demo_{study.script}.py`) | – | – |"
    try:
        ours, ref = module.headline(payload["results"])
    except (KeyError, TypeError, ValueError, IndexError, StopIteration):
        ours, ref = "see its page", "–"
    return f"| {title} | {ours} | {ref} | {_wall_cell(study, payload, runs, module)} |"


def main_job_line(summary, studies):
    """One line on the last main job, from run_all_summary.json (default mode: a 90-minute budget, a
    60-minute target)."""
    if not summary:
        return "_No main job recorded yet: `python demos/run_all.py` writes `figures/run_all_summary.json`._"
    runs = summary.get("experiments", [])
    names = {s.script for s in studies}
    ran = {r["name"] for r in runs}
    done = sum(r["status"] in ("ok", "current") for r in runs if r["name"] in names)
    total = summary["total_wall_time_s"]
    limits = ((90, "budget"), (60, "target"))       # default mode on this machine: the budget, the target
    verdict = " and ".join(f"{'within' if total <= m * 60 else 'over'} the {m}-minute {name}"
                           for m, name in limits) if summary["mode"] == "default" else ""
    later = [s.title for s in studies if s.script not in ran]       # registered after this job ran
    note = f" It predates {and_join(later)}: not in its time." if later else ""
    return (f"*Main job:* `run_all.py` ({summary['mode']} mode, {summary['interpreter']}, commit "
            f"`{str(summary['git_commit'])[:12]}`) completed {done} of the {len(studies) - len(later)} studies it "
            f"ran in {minutes(total)} on this {summary.get('cpu_count', '?')}-core machine"
            + (f", {verdict}." if verdict else ".") + note)


def read_summary(folder):
    """run_all_summary.json of a folder, or None (missing or unreadable, with a warning)."""
    path = os.path.join(folder, "run_all_summary.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"warning: skipping {os.path.relpath(path, ROOT)}: {e}", file=sys.stderr)
        return None


def overview_block(folder, results, reports):
    """Markdown of the README's overview: one row per (study, report module) of ``reports``, then the line
    on the last main job."""
    summary = read_summary(folder)
    runs = (summary or {}).get("experiments", [])
    lines = ["| study | headline here | tutorial | wall time here |", "|---|---|---|---|"]
    lines += [overview_row(s, m, results.get(s.results), runs) for s, m in reports]
    return "\n".join(lines + ["", main_job_line(summary, [s for s, _ in reports])])


def bench_files(folder=FIG_DIR):
    """The core benchmark payloads (figures/bench_core_py*.json) of a folder, in file-name order."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "bench_core_py*.json"))):
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


# ----------------------------------------------------------------------------- molecule grids (RDKit, lazily)


def grid_molecules(smiles, n=12):
    """Up to n valid, distinct SMILES of a list, as (mol, smiles)."""
    from rdkit import Chem, RDLogger
    RDLogger.DisableLog("rdApp.*")
    out, seen = [], set()
    for s in smiles:
        mol = Chem.MolFromSmiles(s) if s else None
        if mol is not None and mol.GetNumAtoms() and s not in seen:
            seen.add(s)
            out.append((mol, s))
        if len(out) == n:
            break
    return out


def molecule_grid(meta, mols, title, out_dir, name):
    """One RDKit grid of (mol, smiles) pairs (``grid_molecules``): PNG through matplotlib (with provenance), SVG
    from RDKit; returns the two paths."""
    from rdkit.Chem import Draw
    legends = [s if len(s) <= 34 else s[:31] + "..." for _, s in mols]
    kw = dict(molsPerRow=4, subImgSize=(230, 190), legends=legends)
    svg = Draw.MolsToGridImage([m for m, _ in mols], useSVG=True, **kw)
    svg_path = os.path.join(out_dir, name + ".svg")
    atomic_write(svg_path, svg if isinstance(svg, str) else svg.data)
    import numpy as np
    img = np.asarray(Draw.MolsToGridImage([m for m, _ in mols], **kw).convert("RGB"))
    pyplot = plt()
    fig, a = pyplot.subplots(figsize=(9, 9 * img.shape[0] / img.shape[1] + 0.4))
    a.imshow(img)
    a.axis("off")
    a.set_title(f"{len(mols)} {title} — " + subtitle(meta), fontsize=8)
    commit_stamp(fig, meta)
    png_path = os.path.join(out_dir, name + ".png")
    atomic_write(png_path, figure_bytes(fig, "png", bbox_inches="tight"))
    pyplot.close(fig)
    return [png_path, svg_path]
