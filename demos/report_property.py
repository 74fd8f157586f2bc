"""What experiments 6-8 (ESOL, materials, HOPV: demos/report_deepchem_*.py) share: the summary table with
the tutorial's columns beside ours, the applicability-domain line, the seed-spread comparison, the
optimiser-schedule line, and the parity, bar and learning-curve figures.

All three results files store results.runs[*] = {split, model, seed, metrics, y_true, y_pred, ...} and
results.summary[*] (mean/std over seeds per split and model); the figures and tables read only those.
"""
import textwrap

import report_kit as kit

PROP_COLS = [("train", "rmse"), ("train", "r2"), ("valid", "rmse"), ("test", "rmse"), ("test", "mae"),
             ("test", "r2"), ("test", "pearson")]


def stat_cell(row, part, key):
    """'x' or 'x ± s' (over seeds) of one summary cell, '–' when absent."""
    v = row.get(f"{part}_{key}")
    if v is None:
        return "–"
    return f"{v:.3f} ± {row[f'{part}_{key}_std']:.3f}" if row.get("n_seeds", 1) > 1 else f"{v:.3f}"


COVERAGE_BAND = (0.85, 0.95)
"""The empirical test coverage a 90 % interval should land in (the band the project set on ESOL's 113 test
molecules)."""


def domain_lines(r, units):
    """The saved model's section: ``saved_model_lines`` for a file written by ``saved_predictor``, the older
    applicability-domain line otherwise (``results.saved_model.domain`` with its in/out errors)."""
    saved = r.get("saved_model") or {}
    if "errors" in saved or "skipped" in saved:
        return saved_model_lines(saved, units, r)
    dom = saved.get("domain")
    if not dom:
        return []
    cells = []
    for part in ("valid", "test"):
        x = dom.get(part)
        if not x or not x.get("n_in"):
            continue
        out = (f"out of domain {x['rmse_out']:.3f} ({x['n_out']})" if x.get("n_out") else "none out of domain")
        larger = ("" if not x.get("n_out") else
                  ": larger out of domain" if x["rmse_out"] > x["rmse_in"] else ": not larger out of domain")
        cells.append(f"{part} RMSE in domain {x['rmse_in']:.3f} {units} ({x['n_in']} inputs), {out}{larger}")
    return ["", f"Applicability domain of the saved model (`predictor.Predictor`; threshold {dom['threshold']}: "
            f"{dom['rule']}): " + "; ".join(cells) + " (unpaired, few inputs out of domain: no test of the gap)."]


def _error_row(label, e):
    """One row of the saved model's error table."""
    return (f"| {label} | {e['n']} | {kit.fmt(e['rmse'])} | {kit.fmt(e['r2'])} | {kit.fmt(e['mean_rmse'])} | "
            f"{kit.fmt(e.get('coverage'), '.2f')} | {kit.fmt(e.get('mean_width'))} |")


def _saved_table(saved, units):
    """Errors, coverage and width through the predictor: validation, test, test in and out of domain."""
    e = saved["errors"]
    rows = [("validation", e["valid"]), ("test", e["test"])]
    rows += [({"in": "test, in domain", "out": "test, out of domain"}.get(d, "test, domain not checked"), x)
             for d, x in e["test"]["by_domain"].items()]
    level = saved["interval"]["level"]
    return ["", f"| inputs | n | RMSE ({units}) | R² | training mean's RMSE | coverage of the {level:.0%} interval | "
                "mean width |", "|---|---|---|---|---|---|---|"] + [_error_row(label, x) for label, x in rows]


def interval_readings(saved, band=COVERAGE_BAND):
    """What the test split says of the interval, each with its threshold: coverage inside ``band`` or not, and
    whether out-of-domain intervals are wider on average than in-domain ones."""
    test, level = saved["errors"]["test"], saved["interval"]["level"]
    cov = test["coverage"]
    inside = band[0] <= cov <= band[1]
    out = [f"test coverage {cov:.2f} of {test['n']} inputs: {'inside' if inside else 'outside'} "
           f"{band[0]:.2f}-{band[1]:.2f} for a {level:.0%} interval"]
    dom = test["by_domain"]
    if "in" in dom and "out" in dom:
        wider = dom["out"]["mean_width"] > dom["in"]["mean_width"]
        out.append(f"out-of-domain intervals {'wider' if wider else 'not wider'} than in-domain ones on average "
                   f"({dom['out']['mean_width']:.3f} over {dom['out']['n']} against {dom['in']['mean_width']:.3f} "
                   f"over {dom['in']['n']})")
    else:
        out.append("no test input on one side of the domain: no width comparison")
    return out


def _cost_line(saved):
    """Seconds per molecule through the predictor, one member against the ensemble."""
    c = saved["cost"]
    def ms(k):
        return f"{1000 * c[k]:.1f} ms"
    return (f"Cost through `predict_detailed` ({c['n_inputs']} validation and test inputs, domain check included): "
            f"one member {ms('single_workers1_s_per_input')} per input on one process "
            f"({ms('single_workers2_s_per_input')} on two), the ensemble {ms('ensemble_workers1_s_per_input')} "
            f"({ms('ensemble_workers2_s_per_input')} on two).")


SCALE_MEANING = {"constant": "0 (a constant width)", "spread": "the members' standard deviation",
                 "similarity": "1 - similarity to the nearest training input"}
"""What u is for each interval scale (``predictor.interval_scale``)."""


def interval_rule(iv):
    """The interval's rule as stored, with u spelled out (files written before saved_predictor said what u is
    read 'u = similarity' where the code uses 1 - similarity)."""
    return iv["rule"].replace(f"u = {iv['scale']};", f"u = {SCALE_MEANING[iv['scale']]};")


def skill_sentence(saved, units, r=None):
    """The saved model's skill against the training mean with its test size, where the predictor states it
    (header and in-domain rows only), and, when the study's comparison row ("Transformer", same split) gets
    another verdict against the mean, that contrary verdict beside it."""
    sk = saved["skill"]
    text = (f"Skill: {sk['statement']} (test RMSE minus the training mean's {sk['diff_rmse']:+.3f} {units}, 95% "
            f"paired interval [{sk['ci_low']:+.3f}, {sk['ci_high']:+.3f}], n = {sk['n_items']} test inputs); the "
            "predictor states it in its header and on the rows predicted in the domain only (any other row says why "
            "it makes no claim)")
    c = kit.find_comparison(r, saved["split"], "Transformer", "mean") if r else None
    if c and (c["verdict"] == "lower") != sk["beats_mean"]:
        text += (f". The study's comparison row (the same recipe on the SMILES as written, {c['n_seeds_a']} seeds) "
                 f"gets the contrary verdict: {' '.join(kit.cmp_text(c))} the mean over the same {c['n_items']} test "
                 "inputs, so this skill rests on one small test split and is not confirmed by that row")
    if not sk["beats_mean"]:
        text += (". The model is shipped with that statement rather than withheld, so that the study's negative "
                 "result travels with the file")
    return text + "."


def saved_model_lines(saved, units, r=None):
    """The saved model's section: the rule and members, the errors through the predictor, the interval and
    its readings, skill against the training mean (``skill_sentence``, with the results ``r`` for the
    comparison row's verdict), cost; or why this run did not train it."""
    if "skipped" in saved:
        return ["", f"The saved model: {saved['skipped']}."]
    members = ", ".join(f"seed {m['seed']} epoch {m['epoch']}" for m in saved["members"])
    iv = saved["interval"]
    widths = ", ".join(f"{k} {v['mean_width']:.3f}" for k, v in iv["choice"].items() if v and v["mean_width"]) \
        or "none: too few inputs"
    lines = [""] + kit.wrap(
        f"**The saved model** (`{saved['path']}`, read by `predictor.load_predictor`; row \"{saved['row']}\" "
        f"above): {saved['rule']}. Members: {members} ({saved['n_params']:,} parameters each). Every number below "
        f"was measured through `load_predictor(...).predict_detailed` on the {saved['split']} split's inputs as "
        "written in the data file, and is stored in the file's meta.")
    lines += _saved_table(saved, units)
    lines += [""] + kit.wrap(f"Interval: {interval_rule(iv)} (mean widths there: {widths}); kept: {iv['scale']}, "
                             f"q = {iv['q']:.3f}, offset {iv['offset']:.3g}. "
                             + "; ".join(interval_readings(saved)) + ".")
    lines += [""] + kit.wrap(skill_sentence(saved, units, r))
    return lines + [""] + kit.wrap(_cost_line(saved))


def saved_difference(r):
    """The Differences entry of the saved model's row (none when this run did not train it)."""
    saved = r.get("saved_model") or {}
    if "errors" not in saved:
        return []
    return [f"The saved model (`{saved['path']}`) and its members' row \"{saved['row']}\" go beyond the tutorial, "
            f"which saves no model: {len(saved['members'])} seeds on {saved['input']}, the {saved['split']} split, "
            f"each at its best validation epoch, as one ensemble with a {saved['interval']['level']:.0%} "
            "split-conformal interval calibrated on the validation split."]


def summary_table(r, ref, split_labels=None):
    """Markdown table of the summary rows with the tutorial's numbers (same columns) beside them; a split is
    shown by its name, or by ``split_labels[name]`` where given."""
    head = " | ".join(f"{p} {k.upper() if k != 'pearson' else 'Pearson'}".replace("R2", "R²") for p, k in PROP_COLS)
    out = [f"| split | model | seeds | {head} | reference (same columns) |", "|---" * (len(PROP_COLS) + 4) + "|"]
    for row in r["summary"]:
        rf = ref.get(f"{row['split']}|{row['model']}", {})
        refs = " / ".join(kit.fmt(rf.get(f"{p}_{k}")) for p, k in PROP_COLS) if rf else "–"
        out.append(f"| {(split_labels or {}).get(row['split'], row['split'])} | {row['model']} | {row['n_seeds']} | "
                   + " | ".join(stat_cell(row, p, k) for p, k in PROP_COLS) + f" | {refs} |")
    return out


def summary_row(r, split, model):
    """The summary row of (split, model), None when that model did not run on that split."""
    return next((x for x in r["summary"] if x["split"] == split and x["model"] == model), None)


def compare_rows(a, b, key="test_rmse"):
    """'lower'/'higher'/'level' for a against b: a gap counts only when it exceeds the seed spread, the larger
    max - min of the two rows (``evaluation.seed_spread``, stored by ``property_common.summarize`` as
    ``<key>_range``; with one seed on both sides there is no spread, and the plain comparison is said to be a
    single run)."""
    gap = a[key] - b[key]
    spread = max(a[f"{key}_range"], b[f"{key}_range"])
    if max(a["n_seeds"], b["n_seeds"]) > 1 and abs(gap) <= spread:
        return "level with (within the seed spread)"
    return "lower than" if gap < 0 else "higher than"


def single_run_note(r):
    """The caveat added once to a reading whose Transformer rows are single runs."""
    return (" (Single runs, seed 0: there is no seed spread to judge these gaps by; `--extended` runs 3 seeds.)"
            if max(x["n_seeds"] for x in r["summary"]) == 1 else "")


def parity_figure(meta, r, out_dir, name, title, units=None):
    """Predicted vs true on the test set, one panel per (split, model), first seed of each (axes in ``units``)."""
    plt = kit.plt()
    first = {}
    for run in r["runs"]:
        first.setdefault((run["split"], run["model"]), run)
    splits = list(dict.fromkeys(k[0] for k in first))
    models = [m for m in dict.fromkeys(k[1] for k in first) if m != "mean"]
    fig, axes = plt.subplots(len(splits), len(models), figsize=(max(6.0, 2.3 * len(models)), 2.4 * len(splits) + 0.4),
                             squeeze=False)
    lo = min(min(x["y_true"] + x["y_pred"]) for x in first.values())
    hi = max(max(x["y_true"] + x["y_pred"]) for x in first.values())
    for i, s in enumerate(splits):
        for j, m in enumerate(models):
            a, run = axes[i][j], first.get((s, m))
            a.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
            if run:
                a.scatter(run["y_true"], run["y_pred"], s=5, alpha=0.5, rasterized=True)   # a light SVG
                t = run["metrics"]["test"]
                a.text(0.04, 0.96, f"RMSE {t['rmse']:.3f}\nR² {t['r2']:.3f}", transform=a.transAxes, va="top",
                       fontsize=7)
            a.set_title("\n".join(textwrap.wrap(f"{s}: {m}", 34)), fontsize=7.5)   # long names must not overlap
            a.set(xlim=(lo, hi), ylim=(lo, hi))
            u = f" ({units})" if units else ""
            if i == len(splits) - 1:
                a.set_xlabel(f"true{u}", fontsize=7)
            if j == 0:
                a.set_ylabel(f"predicted{u}", fontsize=7)
    fig.suptitle(f"{title}: test-set parity (seed {r['seeds'][0]})\n" + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, f"{name}_parity")


def bars_figure(meta, r, out_dir, name, title, ref, units, ref_label="tutorial"):
    """Test RMSE and R² per model and split, error bars = std over seeds, the seed count written on each bar,
    ``ref``'s values as x, labelled ``ref_label`` (only where ``ref`` has that row)."""
    plt = kit.plt()
    rows = r["summary"]
    splits = list(dict.fromkeys(x["split"] for x in rows))
    models = list(dict.fromkeys(x["model"] for x in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0))
    width = 0.8 / len(splits)
    for ax, key, label in zip(axes, ("test_rmse", "test_r2"), (f"test RMSE ({units})", "test R² (no unit)")):
        for k, s in enumerate(splits):
            xs = [i + (k - (len(splits) - 1) / 2) * width for i in range(len(models))]
            got = [summary_row(r, s, m) for m in models]
            ax.bar(xs, [g[key] if g else 0 for g in got], width, yerr=[g.get(f"{key}_std", 0) if g else 0 for g in got],
                   capsize=2, label=f"{s} split", color=f"C{k}")
            for x, g in zip(xs, got):
                if g and key == "test_rmse":
                    ax.text(x, 0, f"{g['n_seeds']}", ha="center", va="bottom", fontsize=6, color="w")
            kit.ref_mark(ax, xs, [ref.get(f"{s}|{m}", {}).get(key) for m in models],
                      label=ref_label if k == 0 else None)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(label)
        ax.axhline(0, color="gray", lw=0.6)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.95), ncol=4,
               fontsize=7, frameon=False)
    fig.suptitle(f"{title}: test metrics, mean ± std over seeds (white number: seeds per bar) — "
                 + kit.subtitle(meta), fontsize=8.5)
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, f"{name}_bars")


TRAIN_CURVE_LABEL = "train (running loss during the epoch)"
"""What the solid curve is: sqrt of the mean training loss over the epoch's steps, the weights changing as it is
summed (``property_common.learning_curve``), not the table's train RMSE of the final weights."""


def curves_figure(meta, r, out_dir, name, title, units, marks=None):
    """Train (solid: the running training loss, ``TRAIN_CURVE_LABEL``) and valid (dashed) RMSE per epoch of every
    Transformer run: one panel per (split, model),
    one colour per seed, so no panel mixes models; ``marks`` {curve key: epoch} rings the chosen epoch (early
    stopping) on the valid curve."""
    plt = kit.plt()
    from matplotlib.lines import Line2D
    groups = {}
    for key in r["curves"]:                                   # key: "<split>/<model>/seed<s>"
        group, seed = key.rsplit("/seed", 1)
        groups.setdefault(group, []).append((int(seed), key))
    ncol = 2 if len(groups) in (2, 4) else min(3, len(groups))
    nrow = -(-len(groups) // ncol)
    height = 3.0 * nrow + 1.0                                # + room for the two-line title and the legend
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(6.0, 4.2 * ncol), height), squeeze=False)
    for a, (group, members) in zip(axes.flat, groups.items()):
        for seed, key in sorted(members):
            curve, colour = r["curves"][key], f"C{seed % 10}"
            ep = [c["epoch"] for c in curve]
            a.plot(ep, [c["train_rmse"] for c in curve], "-o", ms=3, color=colour, lw=1.2)
            if all("valid_rmse" in c for c in curve):
                a.plot(ep, [c["valid_rmse"] for c in curve], "--s", ms=3, color=colour, lw=1.2)
                chosen = [c for c in curve if (marks or {}).get(key) == c["epoch"]]
                if chosen:
                    a.plot([chosen[0]["epoch"]], [chosen[0]["valid_rmse"]], "o", ms=9, mfc="none", color=colour)
        last = max(c["epoch"] for _, key in members for c in r["curves"][key])
        a.set_title(group.replace("/", ": ", 1), fontsize=8)
        a.set(xlabel="epoch", ylabel=f"RMSE ({units})", xlim=(0.5, last + 0.5))   # a 1-epoch run gets tick 1
        a.set_xticks(range(1, last + 1, 1 + (last - 1) // 10))
    for a in list(axes.flat)[len(groups):]:                  # no empty panels
        a.remove()
    seeds = sorted({s for members in groups.values() for s, _ in members})
    handles = [Line2D([], [], color=f"C{s % 10}", label=f"seed {s}") for s in seeds] + [
        Line2D([], [], color="k", ls="-", label=TRAIN_CURVE_LABEL),
        Line2D([], [], color="k", ls="--", label="valid (end of epoch)")]
    if marks:
        handles.append(Line2D([], [], color="k", marker="o", mfc="none", ms=8, ls="none",
                              label="chosen epoch (lowest valid RMSE)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(f"{title}: learning curves\n" + kit.subtitle(meta), fontsize=8.5)
    fig.tight_layout(rect=(0, 0.4 / height, 1, 1 - 0.55 / height))
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, f"{name}_curves")


def grid_parity_figure(meta, r, out_dir, name, title, units):
    """Predicted vs true on the test set, one panel per (split, model) that ran (first seed of each), no
    empty panels: a grid of at most 4 columns, unused cells removed."""
    plt = kit.plt()
    first = {}
    for run in r["runs"]:
        if run["model"] != "mean":
            first.setdefault((run["split"], run["model"]), run)
    ncol = min(4, len(first))
    nrow = -(-len(first) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(2.6 * ncol + 0.4, 2.6 * nrow + 0.6), squeeze=False)
    for k, ((s, m), run) in enumerate(first.items()):
        a = axes[k // ncol][k % ncol]
        lo, hi = min(run["y_true"] + run["y_pred"]), max(run["y_true"] + run["y_pred"])
        a.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
        a.scatter(run["y_true"], run["y_pred"], s=5, alpha=0.5, rasterized=True)   # a light SVG
        t = run["metrics"]["test"]
        a.text(0.04, 0.96, f"RMSE {t['rmse']:.3f}\nR² {t['r2']:.3f}\nseed {run['seed']}", transform=a.transAxes,
               va="top", fontsize=7)
        a.set_title(f"{s}: {m}", fontsize=7)
        a.set(xlim=(lo, hi), ylim=(lo, hi))
        a.set_xlabel(f"true ({units})", fontsize=7)
        a.set_ylabel(f"predicted ({units})", fontsize=7)
    for k in range(len(first), nrow * ncol):
        fig.delaxes(axes[k // ncol][k % ncol])
    fig.suptitle(f"{title}: test-set parity\n" + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, f"{name}_parity")


def recipe_line(rec, target=150):
    """Accumulation, optimiser steps and the warmup's share, against the recipe's 150 warmup steps."""
    s = (f"Optimiser schedule: gradients of {rec['accumulation']} sample{'s' if rec['accumulation'] > 1 else ''} "
         f"per Adam step, {rec['steps']:,} steps, warmup {rec['warmup']} steps "
         f"({100 * rec['warmup_share']:.0f} % of the run)")
    if rec["warmup"] == target:
        return s + f", the recipe's {target}."
    return s + f", not the recipe's {target}: {rec['steps']:,} steps are too few for it."
