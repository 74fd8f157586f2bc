"""The report of the study beyond the tutorial (demos/demo_graduate_torch.py, figures/results_graduate_torch.json):
experiment 9's model on torch's engine: the same losses, the speed-up, and what scale buys.  Its figures, its
page (docs/10-graduate-torch.md) and its overview row; the interface is report_kit's.  The tutorial has no such
study, so there are no tutorial numbers here; the pure-Python point of the scale figure is experiment 9's
strongest model, read from results_reaction.json beside the results (or in figures/)."""
import json
import math
import os

import report_kit as kit

LOSS_TOL = 1e-9                     # torch's losses must follow the pure-Python ones within this

def _exp9_run(name, folder=None):
    """Experiment 9's run ``name`` (reference / strong) from results_reaction.json in ``folder`` or figures/,
    or None."""
    for d in ([folder] if folder else []) + [kit.FIG_DIR]:
        path = os.path.join(d, "results_reaction.json")
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    return json.load(f)["results"]["runs"][name]
            except (KeyError, ValueError, TypeError):
                return None
    return None


def _py_point(folder=None):
    """Experiment 9's strongest pure-Python model in the committed results: (label, training minutes, greedy
    top-1, valid, Tanimoto) of its --extended "strong" run where present, else of its reference run, or None."""
    for name, label in (("strong", "pure Python, exp. 9 strongest (greedy)"),
                        ("reference", "pure Python, exp. 9 reference (greedy)")):
        s = _exp9_run(name, folder)
        if s:
            g = s["metrics"]["greedy"]["test500"]
            label = label[:-1] + "; training resumed across calls)" if s.get("resumed_at_steps") else label
            return label, s["train_wall_s"] / 60, g["top1"], g["valid"], g["tanimoto"], g["n"]
    return None


def fig_graduate_reproduce(meta, r, out_dir):
    """(b) loss per step, torch against pure Python, and their difference; (a) seconds per step."""
    plt = kit.plt()
    rep, sp = r["reproduce"], r["speed"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.4))
    ct, cp = rep["curve_torch"], rep["curve_python"]
    a.plot(range(1, len(ct) + 1), ct, lw=1.0, label="train_torch, float64")
    a.plot(range(1, len(cp) + 1), cp, "o", ms=2.5, label="transformer.train (pure Python)")
    a.set(xlabel="optimiser step", ylabel="train loss (nats / token)", title="(b) Experiment 9 reference run")
    a.legend()
    n = rep["n_match"]
    diffs = [max(abs(x - y), 1e-18) for x, y in zip(ct[:n], cp[:n])]
    b.semilogy(range(1, n + 1), diffs, "o-", ms=2.5, label="|torch − pure Python| (0 drawn at 1e-18)")
    b.axhline(1e-9, color="r", ls="--", lw=1, label="tolerance 1e-9")
    b.set(xlabel="optimiser step", ylabel="absolute loss difference (nats / token)",
          title=f"(b) First {n} steps: same losses")
    b.legend()
    names = list(sp)
    xs = range(len(names))
    w, th = sp[names[0]]["workers"], sp[names[0]]["torch_threads"]
    for k, (key, label) in enumerate((("pure_python_s_per_step", f"pure Python, {w} workers"),
                                      ("torch64_s_per_step", f"torch float64, {th} threads"),
                                      ("torch32_s_per_step", f"torch float32, {th} threads"))):
        c.bar([x + (k - 1) * 0.27 for x in xs], [sp[m][key] for m in names], 0.27, label=label)
    c.set_yscale("log")
    lo, hi = c.get_ylim()
    c.set_ylim(lo, hi * 30)                                             # room for the legend above the bars
    c.set_xticks(list(xs), [f"{m}\n({sp[m]['params']:,} params)" for m in names])
    c.set(ylabel="seconds per optimiser step (log)", title="(a) Speed on the same batches")
    c.legend(fontsize=7)
    fig.suptitle("Graduate to PyTorch: reproduction and speed — " + kit.subtitle(meta), fontsize=9)
    fig.tight_layout(rect=(0, 0.02, 1, 0.93))
    kit.corner_stamp(fig, meta)
    return kit.save(fig, out_dir, "graduate_torch_reproduce")


def fig_graduate_scale(meta, r, out_dir):
    """(c) top-1, validity and Tanimoto against training minutes (only when the scale run is present)."""
    sc = r.get("scale")
    if not sc or not sc.get("points"):
        return []
    plt = kit.plt()
    copy = sc["baselines"]["copy_largest"]
    py = _py_point(out_dir)
    cal = r.get("calibration")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.9))
    for ax, key, label, unit in zip(axes, ("top1", "valid", "tanimoto"),
                                    ("top-1 exact match", "RDKit validity of the top-1", "mean Tanimoto of the top-1"),
                                    ("fraction of test reactions", "fraction of test reactions",
                                     "Tanimoto to the true product (0-1)")):
        for k, curve in enumerate(_curves(r)):
            mins = [_minutes(p) for p in curve["points"]]
            for method, mk in (("beam5", "o-"), ("greedy", "s--")):
                ax.plot(mins, [p["metrics"][method][key] for p in curve["points"]], mk, color=f"C{k}",
                        alpha=1.0 if method == "beam5" else 0.6, label=f"{_curve_label(curve)}, {method}" + (
                            " (the wide host's equivalent minutes)" if k and method == "beam5" else ""))
        ax.axhline(copy[key], color="gray", ls=":", label="copy the largest reactant")
        if key == "top1":
            ax.axhline(GRADUATE_TOP1_TARGET, color="tab:green", ls="--", lw=1, label="stretch target, top-1")
        if py:
            ax.plot([py[1]], [py[2 + ("top1", "valid", "tanimoto").index(key)]], "k*", ms=9, label=py[0])
        if cal:
            ax.plot([cal["minutes"]], [cal["metrics"]["greedy"][key]], "D", color="tab:red",
                    label="plain nn.Transformer (greedy)")
        ax.set(xlabel="training minutes (2 CPU cores)", ylabel=unit,
               title=label, ylim=(-0.02, 1.02))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    n = copy["n"]
    fig.suptitle(f"Graduate to PyTorch: what scale buys on experiment 9 ({n} test reactions) — " + kit.subtitle(meta),
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.14, 1, 0.93))
    kit.corner_stamp(fig, meta)
    return kit.save(fig, out_dir, "graduate_torch_scale")


def _curves(r):
    """The scored curves of (c), the wide one first: results.scale, then results.same_size when present."""
    return [r[k] for k in ("scale", "same_size") if (r.get(k) or {}).get("points")]


def _minutes(point):
    """A point's place on the training-minutes axis: its own training minutes, or for a point budgeted against
    the wide curve (the same-size curve) the wide host's equivalent minutes."""
    return point.get("equivalent_minutes", point["train_minutes"])


def _curve_label(curve):
    """'torch d = 128, 3 + 3 layers' from a curve's config."""
    c = curve["config"]
    return f"torch d = {c['d_model']}, {c['n_layers']} + {c['n_layers']} layers"


def _speed_table(sp):
    out = ["| model | params | batch | steps | pure Python, 2 workers (s/step) | torch float64 (s/step) | "
           "torch float32 (s/step) | speed-up float64 | speed-up float32 |", "|---|---|---|---|---|---|---|---|---|"]
    for m, x in sp.items():
        out.append(f"| {m} | {x['params']:,} | {x['batch_size']} | {x['n_steps']} | "
                   f"{x['pure_python_s_per_step']:.3f} | {x['torch64_s_per_step']:.4f} | "
                   f"{x['torch32_s_per_step']:.4f} | {x['ratio64']:.0f}× | {x['ratio32']:.0f}× |")
    return out


def _scale_table(r):
    sc, cal = r["scale"], r.get("calibration")
    out = ["| model | training minutes | steps | epochs | top-1 (beam 5) | top-5 | greedy top-1 "
           "| valid [95 % interval] | Tanimoto | "
           "conserved |", "|---|---|---|---|---|---|---|---|---|---|"]
    for curve in _curves(r):
        for p in curve["points"]:
            b, g = p["metrics"]["beam5"], p["metrics"]["greedy"]
            label = _curve_label(curve) + (f", {p['kind']}" if p.get("kind") else "")
            mins = f"≙ {p['equivalent_minutes']:.1f}" if "equivalent_minutes" in p else f"{p['train_minutes']:.1f}"
            out.append(f"| {label} | {mins} | {p['steps']:,} | "
                       f"{p['epochs']:.2f} | {b['top1']:.3f} | {b['top5']:.3f} | {g['top1']:.3f} | {kit.valid_ci(b)} | "
                       f"{b['tanimoto']:.3f} | {b['conserved']:.3f} |")
    if cal:
        g = cal["metrics"]["greedy"]
        out.append(f"| plain nn.Transformer (greedy) | {cal['minutes']:.1f} | {cal['steps']:,} | {cal['epochs']:.2f} | "
                   f"– | – | {g['top1']:.3f} | {kit.valid_ci(g)} | {g['tanimoto']:.3f} | {g['conserved']:.3f} |")
    cp = sc["baselines"]["copy_largest"]
    out.append(f"| copy the largest reactant | – | – | – | {cp['top1']:.3f} | {cp['top5']:.3f} | – | "
               f"{kit.valid_ci(cp)} | {cp['tanimoto']:.3f} | {cp['conserved']:.3f} |")
    return out


def _load_note(sp):
    """A warning when the machine's 1-minute load exceeded its core count while (a) was timed."""
    loads = [x for rec in sp.values() for x in rec.get("load_average_1min") or [] if x is not None]
    cores = max((rec.get("cpu_count") or 0) for rec in sp.values())
    if loads and cores and max(loads) > cores:
        return (f" (measured on a busy machine: 1-minute load up to {max(loads):.1f} on {cores} cores, so these "
                "times are inflated, torch's threaded ones most)")
    return ""




GRADUATE_TOP1_TARGET = 0.30         # the stretch target's beam-5 top-1
GRADUATE_RISE = 0.01                # a metric gaining more than this per doubling of training time is rising
GRADUATE_FIT_POINTS = 2             # the extrapolation uses the last this-many points (the local slope: curves bend)


def loglin(xs, ys):
    """Least squares y = a + b·log2(x): (a, b), b being the change per doubling of x."""
    lx = [math.log2(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in lx)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def _minutes_text(m):
    return f"{m:.0f} minutes" if m < 120 else f"{m / 60:.0f} hours" if m < 14400 else f"{m / 1440:,.0f} days"


def _target_status(name, label, mins, ys, target, reached):
    """One target's clause: reached, matched but not passed (the paired test says level), or the local gain
    per doubling of training time and where that slope, continued, would reach it.  Returns (clause, rising)."""
    a, b = loglin(mins, ys) if len(ys) > 1 else (ys[0], 0.0)
    gain = f"{label} {b:+.3f} per doubling of training time"
    if reached:
        return f"{name} is reached at {mins[-1]:.0f} training minutes", True
    if ys[-1] >= target:
        return f"{name} is matched but not passed at {mins[-1]:.0f} training minutes (paired test: level; {gain})", \
            True
    if b <= GRADUATE_RISE:
        return f"{name} is not being approached ({gain})", False
    return f"{name} would take about {_minutes_text(2 ** ((target - a) / b))} of this machine ({gain})", True


def compute_sentences(sc, separated=False):
    """[verdict, extrapolation]: whether experiment 9's numbers still move with training time along the curve, and
    roughly how far they would have to go: for each target
    (beam-5 top-1 GRADUATE_TOP1_TARGET; a Tanimoto above copying the largest reactant, by the stored paired test
    where there is one), reached or matched, or its gain per doubling of training time between the last
    GRADUATE_FIT_POINTS points and where that slope, continued, puts it; and whether the curve is flattening
    (a local top-1 slope under half the whole curve's).  A target reached, matched or approached faster than
    GRADUATE_RISE per doubling makes the curve 'still moving'.  ``separated``: the page has the same-size
    curve, which splits what the training time bought."""
    pts, copy = sc["points"][-GRADUATE_FIT_POINTS:], sc["baselines"]["copy_largest"]
    mins = [p["train_minutes"] for p in pts]
    c = _copy_tanimoto(sc)
    parts, rising = [], False
    for key, label, target, name in (
            ("top1", "top-1", GRADUATE_TOP1_TARGET, f"top-1 {GRADUATE_TOP1_TARGET:.2f}"),
            ("tanimoto", "Tanimoto", copy["tanimoto"], f"the copy baseline's Tanimoto ({copy['tanimoto']:.3f})")):
        ys = [p["metrics"]["beam5"][key] for p in pts]
        reached = ys[-1] >= target if key == "top1" or c is None else c["verdict"] == "higher"
        clause, up = _target_status(name, label, mins, ys, target, reached)
        parts.append(clause)
        rising |= up
    whole = loglin([p["train_minutes"] for p in sc["points"]], [p["metrics"]["beam5"]["top1"] for p in sc["points"]])[1]
    local = loglin(mins, [p["metrics"]["beam5"]["top1"] for p in pts])[1] if len(pts) > 1 else 0.0
    if local < whole / 2:
        parts.append(f"the curve is flattening (top-1 {whole:+.3f} per doubling over the whole curve, {local:+.3f} "
                     "over its last stretch)")
    verdict = "still moves with training time" if rising else "does not move with training time: the curve is flat"
    bought = ("the same-size curve above splits what that time bought into data and width" if separated else
              "that time bought data, width and steps together")
    return [f"Along the wide curve, experiment 9's negative result {verdict} (a metric counts as rising above "
            f"+{GRADUATE_RISE} per doubling of training time); {bought}.",
            f"The slope between the last {len(pts)} points in log training time, continued (rough: such curves "
            "bend, so read the times as orders of magnitude, not forecasts), says: " + "; ".join(parts) + "."]


def _copy_tanimoto(sc):
    """The stored paired comparison of the final point's beam-5 Tanimoto with copying the largest reactant, or
    None (runs before the comparison was stored)."""
    return next((c for c in sc.get("comparisons", []) if c["a"] == "torch scale, beam5"
                 and c["b"] == "copy_largest" and c["metric"] == "tanimoto"), None)




def _ref_note():
    """Experiment 9's own training time, with the speed of the host it ran on where recorded (the two runs
    may have run on hosts of different speeds)."""
    ref = _exp9_run("reference")
    if not (ref and "train_wall_s" in ref):
        return ""
    with open(os.path.join(kit.FIG_DIR, "results_reaction.json"), encoding="utf-8") as f:
        host = json.load(f).get("matmul_mflops")
    where = (f", on a host at {host['start']:.0f} Mflop/s (`transformer.matmul`; the Speed table's host: see Speed)"
             if host else "")
    if ref.get("resumed_at_steps"):
        where = (", summed over the calls its training was resumed across" + (f" (the last on a host at "
                 f"{host['start']:.0f} Mflop/s; the earlier ones' speeds are not recorded)" if host else ""))
    return (f"; experiment 9's own pure-Python reference run trained in {ref['train_wall_s']:.0f} s, validation "
            "included, in its own run" + where)



def scale_sentences(sc):
    """The final point against copy and the stretch target (beam-5 top-1 >= GRADUATE_TOP1_TARGET and a Tanimoto
    the paired test puts above copying the largest reactant): [the final point, the stretch target]."""
    last, copy = sc["points"][-1], sc["baselines"]["copy_largest"]
    b, c = last["metrics"]["beam5"], _copy_tanimoto(sc)
    side = {"higher": "above", "lower": "below", "level": "level with"}
    vs_copy = (kit.judged(f"{side[c['verdict']]} copy's {copy['tanimoto']:.3f}", f"paired Δ {c['diff']:+.3f}, 95 % "
                          f"interval [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] over {c['n_items']} reactions") if c else
               f"against {copy['tanimoto']:.3f} for copy (no paired test stored)")
    reached = b["top1"] >= GRADUATE_TOP1_TARGET and c is not None and c["verdict"] == "higher"
    return [f"After {last['train_minutes']:.1f} training minutes ({last['steps']:,} steps, {last['epochs']:.1f} "
            f"epochs of {sc['n_train']:,} reactions) beam-5 top-1 is {b['top1']:.3f} and Tanimoto {b['tanimoto']:.3f}, "
            f"{vs_copy}" + outcome_clause(sc) + ".",
            f"The stretch target (top-1 ≥ {GRADUATE_TOP1_TARGET:.2f} and a Tanimoto above the copy baseline) was "
            f"{'reached' if reached else 'not reached'}, on {sc.get('threads', 2)} CPU threads"
            f"{', no GPU' if sc.get('device', 'cpu') == 'cpu' else ''} (the host's speed is in the provenance line)."]


OUTCOME_WORDS = {"exact": "exact hits", "valid_wrong": "valid but wrong", "invalid": "invalid"}
CLOSER = {"lower": "copy is closer", "higher": "the model is closer", "level": "level"}


def outcome_clause(sc):
    """'; by outcome of the top-1: …' from the final point's outcome split (the mean Tanimoto of each part
    beside copy's on the same reactions, and the paired test on the valid but wrong ones); '' without it."""
    o = sc.get("outcomes")
    if not o:
        return ""
    parts = [f"{o[k]['n']} {OUTCOME_WORDS[k]} ({kit.fmt(o[k]['tanimoto'])}; copy {kit.fmt(o[k]['copy_tanimoto'])})"
             for k in OUTCOME_WORDS if o[k]["n"]]
    c = o["valid_wrong"].get("comparison")
    out = "; by outcome of the top-1 (its Tanimoto; copy's on the same reactions): " + kit.and_join(parts)
    if c:
        out += ("; on the valid but wrong ones " + kit.judged(CLOSER[c["verdict"]], f"paired Δ {c['diff']:+.3f}, "
                f"95 % interval [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] over {c['n_items']} reactions"))
        if c["verdict"] == "lower":
            out += ", so the mean level with copy is exact hits offsetting wrong answers that copying beats"
    return out


def size_sentence(r):
    """What the wide curve had that experiment 9's reference had not (examples seen, reactions, parameters),
    and, with the same-size curve, what the whole training split buys at experiment 9's size against what the
    width adds: its points at equal steps and equal compute against the wide point they match, paired over the
    same test reactions."""
    sc, ss, ref = r["scale"], r.get("same_size"), _exp9_run("reference")
    last = sc["points"][-1]
    out = ""
    if ref and "config" in ref:
        seen = last["steps"] * sc["config"]["batch_size"] / (ref["n_steps"] * ref["config"]["batch_size"])
        out = (f"Against experiment 9's pure-Python reference the wide curve saw {seen:.0f}× the training examples, "
               f"from {sc['n_train'] / ref['n_train']:.0f}× the reactions, with {sc['params'] / ref['params']:.0f}× "
               "the parameters")
    if not (ss and ss.get("against_scale")):
        return (out + ": its compute buys data, width and steps together.") if out else None
    by = {(c["kind"], c["metric"]): c for c in ss["against_scale"]}
    wide = next(p for p in sc["points"] if p["key"] == ss["against_scale"][0]["wide_point"])
    word = {"lower": "below", "higher": "above", "level": "level with"}

    def vs(kind):
        p = next(x for x in ss["points"] if x.get("kind") == kind and x.get("matches") == wide["key"])
        return f"{kind} ({p['steps']:,} steps) " + " and ".join(
            kit.judged(f"{name} {c['mean_a']:.3f}, {word[c['verdict']]} the wide model's {c['mean_b']:.3f}",
                       f"paired Δ {c['diff']:+.3f}, 95 % interval [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]")
            for name, c in (("top-1", by[(kind, "top1")]), ("Tanimoto", by[(kind, "tanimoto")])))
    kinds = list(dict.fromkeys(c["kind"] for c in ss["against_scale"]))
    return ((out + ". ") if out else "") + (
        f"Separated at the wide model's {wide['train_minutes']:.0f}-minute point ({wide['steps']:,} steps), beam 5 on "
        f"the same {ss['against_scale'][0]['n_items']} reactions: experiment 9's own size (d = "
        f"{ss['config']['d_model']}, {ss['params']:,} parameters) on the same {ss['n_train']:,} reactions and recipe "
        "reaches, at " + "; at ".join(vs(k) for k in kinds) + ".")


def reading(r):
    """From the numbers: the speed-up and the agreement of the losses (LOSS_TOL), and (with the scale run) the
    final point against copy and by outcome, the stretch target, what the wide curve had more of (and, with the
    same-size curve, data against width), and whether, and roughly how far, training time moves experiment 9's
    negative result.  At most six bullets."""
    sp, rep = r["speed"], r["reproduce"]
    ok = rep["max_abs_loss_diff_first_n"] <= LOSS_TOL
    out = [f"Pure-Python time per step / torch time per step ({sp['reference']['torch_threads']} threads, float64): "
           f"{sp['reference']['ratio64']:.1f} for experiment 9's reference model and "
           f"{sp['lm_d48']['ratio64']:.1f} for the d = {sp['lm_d48']['config']['d_model']} LM{_load_note(sp)}; the "
           f"torch reference run {'follows' if ok else 'does NOT follow'} the pure-Python losses within "
           f"{LOSS_TOL:.0e}".replace("e-0", "e-") + f" over the first {rep['n_match']} steps (largest difference "
           f"{rep['max_abs_loss_diff_first_n']:.1e})."]
    sc = r.get("scale")
    if not sc or not sc.get("points"):
        return out + ["The scale curve (c) has not been run (`--extended`)."]
    size = size_sentence(r)
    verdict, slope = compute_sentences(sc, separated=bool((r.get("same_size") or {}).get("against_scale")))
    return out + scale_sentences(sc) + ([size] if size else []) + [
        verdict, slope + " One seed: the curve says which way compute moves the numbers, not by how much for certain."]


def _reproduce_line(r):
    rep, sp, bc = r["reproduce"], r["speed"], r["beam_check"]
    return (f"(b) Experiment 9's reference run ({rep['n_steps']} steps) with `train_torch` in float64: "
            f"{rep['torch_wall_s']:.0f} s, against about {rep['python_wall_s_estimate']:.0f} s for the same steps in "
            f"pure Python ({sp['reference']['pure_python_s_per_step']:.2f} s/step of (a) × {rep['n_steps']}; "
            f"validation not included{_ref_note()}). Its first {rep['n_match']} losses differ from the pure-Python "
            f"run's by at most {rep['max_abs_loss_diff_first_n']:.1e}. Beam search in torch and our `beam_search` on "
            f"`from_torch(module)` give the same top beam for {bc['same_top_beam']} of {bc['n']} test reactions.")


def _scale_lines(r):
    """(c): the scale table, experiment 9's strongest pure-Python model, the scale model's beam check."""
    sc, py = r["scale"], _py_point()
    whole = sc["config"].get("n_train") is None
    resumed = (" The scale training and its scored points were resumed from the checkpoint folder an earlier call of "
               "the same command left: the wall time in the provenance line is the last call's, the training minutes "
               "below are the trainings' own." if sc.get("resumed") else "")
    out = [f"(c) {'The whole training split' if whole else 'A sample of the training split'} ({sc['n_train']:,} "
           f"reactions, V = {sc['vocab_size']}), {sc['params']:,} parameters; "
           f"{sc['baselines']['copy_largest']['n']} test reactions.{resumed}", ""] + _scale_table(r) + [""]
    if py:
        out += [f"{py[0][0].upper() + py[0][1:]}: {py[1]:.0f} training minutes, top-1 {py[2]:.3f}, valid "
                f"{kit.rate_ci(round(py[3] * py[5]), py[5])}, Tanimoto {py[4]:.3f} ({py[5]} test reactions; its "
                "training minutes "
                + ("summed over those calls, on hosts of differing speed)." if "resumed" in py[0]
                   else "on its own host)."), ""]
    out += _same_size_lines(r) + _outcome_table(r)
    sbc = sc["beam_check"]
    return out + [f"Scale model brought back with `from_torch` and decoded by our pure-Python `beam_search`: same "
                  f"top beam as torch's (float32) for {sbc['same_top_beam']} of {sbc['n']} test reactions."]


def _same_size_lines(r):
    """How the same-size curve was budgeted and run: its model, the step-cost ratio behind 'equal compute',
    its own wall minutes, threads and host."""
    ss = r.get("same_size")
    if not (ss and ss.get("points") and ss.get("budget")):
        return []
    b, c = ss["budget"], ss["config"]
    rounds = "; ".join(f"{x['wide_s_per_step']:.3f} / {x['same_size_s_per_step']:.3f} s at load "
                       f"{x['load_average_1min']:.1f}" for x in b["rounds"])
    speed = (ss.get("host") or {}).get("matmul_mflops")
    return [f"The same-size curve: experiment 9's model (d = {c['d_model']}, {c['n_layers']} + {c['n_layers']} layers, "
            f"d_ff = {c['d_ff']}, V = {ss['vocab_size']}: {ss['params']:,} parameters) with the wide curve's data and "
            f"recipe (batch {c['batch_size']}, lr {c['lr']:g}, warmup {c['warmup']}, label smoothing "
            f"{c['label_smoothing']:g}), budgeted in steps against the wide curve's "
            f"{kit.and_join([f'{m:g}' for m in c['match_minutes']])}-minute "
            "point, because this host is shared and its wall minutes are not a fixed amount of compute: *equal "
            "steps* sees the same training examples; *equal compute* takes the steps the smaller model makes in the "
            f"wide one's time, the wide model's step costing {b['ratio']:.2f}× the smaller one's here (median of "
            f"{len(b['rounds'])} interleaved rounds, wide / same size: {rounds}). ≙ marks the wide host's equivalent "
            "minutes; the same-size training itself took "
            + ", ".join(f"{p['train_minutes']:.0f}" for p in ss["points"]) + f" minutes on {ss.get('threads', '?')} "
            "threads" + (f", host matmul {speed['start']:.0f} → {speed['end']:.0f} Mflop/s" if speed else "") + "."
            + _not_run_note(r), ""]


def _not_run_note(r):
    """' The equal-compute point … was not run: …' when the same-size curve has no equal-compute point, with
    the steps it would take and the hours at the same-size training's own pace here."""
    ss, sc = r["same_size"], r["scale"]
    if any("compute" in p.get("kind", "") for p in ss["points"]):
        return ""
    notes = []
    for m in ss["config"]["match_minutes"]:
        wide = ([x for x in sc["points"] if x["mark_minutes"] <= m] or sc["points"])[-1]
        steps = round(wide["steps"] * ss["budget"]["ratio"])
        pace = ss["points"][-1]["train_minutes"] / ss["points"][-1]["steps"]
        notes.append(f"{steps:,} steps, about {steps * pace / 60:.0f} hours at the pace of the same-size training here")
    return (" The equal-compute point (" + "; ".join(notes) + ") was not run: the host was shared with other long "
            "runs throughout.")


def _outcome_table(r):
    """Each curve's final point (beam-5 top-1) by outcome, with copy's Tanimoto on the same reactions."""
    rows = []
    for curve in _curves(r):
        o = curve.get("outcomes")
        for k in OUTCOME_WORDS if o else ():
            rows.append([_curve_label(curve), OUTCOME_WORDS[k], o[k]["n"], kit.fmt(o[k]["tanimoto"]),
                         kit.fmt(o[k]["copy_tanimoto"])])
    if not rows:
        return []
    return (["Final points by outcome of the beam-5 top-1 (Tanimoto to the true product; copy scored on the same "
             "reactions):", ""] + kit.table(["model", "outcome", "reactions", "Tanimoto", "copy, same reactions"], rows)
            + [""])


def page(payload):
    """The page parts (report_kit.Page): (a) and (b) set pure Python beside torch (there are no tutorial
    numbers), (c) goes beyond."""
    r = payload["results"]
    comparison = (["The tutorial has no such study: the comparison here is pure Python against torch on the same "
                   "model and batches.", "", "(a) Seconds per optimiser step on the same batches from the same "
                   f"initial weights (torch {r.get('torch_version', '?')}):", ""]
                  + _speed_table(r["speed"]) + ["", _reproduce_line(r)])
    extras = _scale_lines(r) if r.get("scale") else []
    figs = ["graduate_torch_reproduce"] + (["graduate_torch_scale"] if r.get("scale") else [])
    return kit.Page(comparison, reading(r), DIFFERENCES, extras, figs)


def headline(r):
    """The overview row (kept short: the page has the rest): torch's speed-up per step, the wide curve's last
    point beside copy on the same reactions, and the same-size curve's last point beside the wide point it
    matches (the same statistic at the same compute, never beside the wide curve's last point)."""
    text = f"torch {r['speed']['reference']['ratio64']:.1f}× faster per step"
    pts = (r.get("scale") or {}).get("points")
    if pts:
        b = pts[-1]["metrics"]["beam5"]
        text += (f"; d = {r['scale']['config']['d_model']}, {pts[-1]['train_minutes']:.0f} min on all reactions"
                 f": top-1 {b['top1']:.3f}, Tanimoto {b['tanimoto']:.3f} (copy "
                 f"{r['scale']['baselines']['copy_largest']['tanimoto']:.3f})")
    ss = [p for p in (r.get("same_size") or {}).get("points", []) if p.get("matches")]
    if ss and pts:
        wide = next(p for p in pts if p["key"] == ss[-1]["matches"])
        text += (f"; at {wide['train_minutes']:.0f} min, {ss[-1]['kind']}: d = "
                 f"{r['same_size']['config']['d_model']} top-1 {ss[-1]['metrics']['beam5']['top1']:.3f} vs "
                 f"{wide['metrics']['beam5']['top1']:.3f}")
    return text, "–"


QUESTION = ("Beyond the tutorial, which stops at the pure-Python models: does experiment 9's encoder-decoder, "
            "handed to PyTorch by `torch_bridge.py`, give the same losses, how much faster does it train, and does "
            "the speed-up, spent on the whole training split and a wider model, turn experiment 9's negative result "
            "around, and which of the two does it? There is no tutorial answer; the pages of experiments 1-9 hold "
            "the tutorial's numbers.")
FIGURES = [fig_graduate_reproduce, fig_graduate_scale]
DIFFERENCES = [
    "Not in the tutorial: it stops at the pure-Python models. Everything here is this project's addition.",
    "(a) and (b) use experiment 9's reference setting and data unchanged; torch runs with 2 intra-op threads, "
    "pure Python with 2 data-parallel workers; seconds per step are wall-clock times of whole training calls "
    "(torch after a one-step warm-up).",
    "(c) uses the whole training split, d = 128 with 3 + 3 layers, batch 64, lr 1e-3 after 300 warmup steps, label "
    "smoothing 0.1, float32, no augmentation (the reasons are in the script's docstring); the calibration row is a "
    "plain `torch.nn.Transformer` (dropout 0.1, pre-LN) with the same width, depth, data and schedule, greedy "
    "decoding; the same-size curve is experiment 9's model (d = 48, 2 + 2 layers) with the wide curve's data and "
    "recipe, budgeted in steps against one wide point (equal steps, equal compute)."]
