"""Experiment 10's report (demos/demo_data_hunger.py, figures/results_data_hunger.json): from how many MOSES molecules
on does a Transformer beat a tuned n-gram?  Its figures, its page (docs/13-data-hunger.md) and its overview row; the
interface is report_kit's.  Every number is read from the results file; a default-mode file (fewer sizes, one
width, one seed) is rendered as such, with what is missing named."""
import report_kit as kit

SECTION_11_RULE = 1000          # the tutorial's §11.3: under about 1,000 effective training samples, not a Transformer
TREND_FLAT = 0.02               # bits/token: a gap that moves less than this between the end sizes is "flat"
# MOSES's published rows (Polykovskiy et al. 2020, Table 2; 30,000 samples a run, full 1.58 M training set): their
# means over runs; their spread is theirs and not shown (not checked against their table here), no interval of ours.
MOSES_ROWS = [("CharRNN (MOSES)", 0.975, 0.073), ("NGram (MOSES)", 0.238, 5.507)]
MOSES_N = 30_000        # samples in each of MOSES's runs
FULL_SAMPLES = 10_000   # the extended plan's samples per model

QUESTION = ("Experiment 4 ended negative: at 902 training molecules no recipe lets the tutorial's Transformer beat a "
            "tuned Kneser-Ney n-gram. From how many molecules on does it pay? The study: nested MOSES subsets of "
            "1,000 to 100,000 molecules, both models scored on the same 10,000 test molecules (what this run holds: "
            "the next section). The tutorial has no such experiment; its §11.3 counts small data (under about "
            f"{SECTION_11_RULE:,} effective training samples, no pre-trained model) among its reasons to drop a "
            "plain Transformer.")
DIFFERENCES = [
    "The tutorial has no such experiment: §11.3's small-data rule (under about 1,000 effective training samples, no "
    "pre-trained model) is the comparison, not a number it measured, and its samples need not be molecules.",
    "MOSES's CharRNN and NGram rows are theirs: 30,000 samples from models trained on all 1.58 M molecules, an "
    "additive-smoothing n-gram; ours are tuned Kneser-Ney n-grams and Transformers on at most 100,000 molecules.",
    "The tutorial width's parameter count differs from 39,360 only through the vocabulary (each subset's own, "
    "the table's column).",
    "The Transformer trains with experiment 4's ladder recipe (per-token loss, early stopping, dropout), here in "
    "float32 through torch_bridge (experiment 4 trained in float64).",
]


def differences(r):
    """DIFFERENCES, and the core check's sentence only where the run holds one."""
    ck = r.get("core_check")
    if not ck:
        return DIFFERENCES
    return DIFFERENCES[:-1] + [DIFFERENCES[-1][:-1] + f"; the core check ({ck['epochs']} epochs, no dropout, "
                               + ("float64" if "float64" in ck["bridge_engine"] else "the bridge's dtype")
                               + ") shows the pure-Python core and the bridge "
                               + ("are one model." if ck["agree"] else "DISAGREE.")]


def _held(r, config=None):
    """What this run holds, built from its plan and rows: sizes and widths run, how the dropout rate and the
    epochs were chosen (the question's second half)."""
    plan, rows = r["plan"], _rows(r)
    runs = r["transformer_runs"]
    widths = "; ".join(f"{w} width at N = " + ", ".join(f"{int(n):,}" for n in sorted(map(int, by)))
                       for w, by in plan["widths"].items())
    ngram = ", ".join(f"{int(n):,}" for n in sorted(map(int, r["ngram"])))
    rate = (f"the dropout rate chosen on validation ({_rate_search(r)})" if plan["rates"] else
            f"dropout fixed at {kit.and_join(sorted({str(x['rate']) for x in rows}))} (not searched)")
    capped = any(t["chosen"]["epoch"] >= t["recipe"]["epochs"] for t in runs)
    import demo_data_hunger as dh
    patience = (config or {}).get("patience")
    stop = ("early stopping on validation" + (f" (patience {patience} epochs)" if patience else "")
            + (" within epoch caps (which runs the caps ended: the reading)" if capped else ""))
    g = [r["ngram"][k] for k in sorted(r["ngram"], key=int)]
    interior = all(all(x["interior"].values()) for x in g)
    ngram += (f" ({kit.and_join(sorted({x['variant'] for x in g}))} Kneser-Ney; order "
              + ", ".join(str(x["n"]) for x in g) + "; discount scale "
              + ", ".join(str(x["discount"]) for x in g)
              + ("; both inside their grids at every size" if interior else "; NOT inside the grid everywhere") + ")")
    arch = "; ".join(f"{w}: d = {a['d_model']}, {a['n_layers']} layers, {a['n_heads']} heads, d_ff = {a['d_ff']}"
                     for w, a in (r.get("widths") or {}).items() if w in plan["widths"])
    reuse = (" At a searched size, the searched width's seed-0 row is the run of the rate chosen there (seeds 1 and "
             "2 train at that rate)" + _without_seed0(r) + "." if plan["rates"] else "")
    return (f"This run: the n-gram at N = {ngram}, in two passes on validation (the order upwards under interpolated "
            f"Kneser-Ney, D = 0.75, until {dh.ORDER_PATIENCE} larger orders in a row are no better; then variant and "
            f"discount at that order); the Transformer's {widths} ({arch}), {rate}, {stop}.{reuse}")


def _without_seed0(r):
    """The searched rows' gaps over the seeds other than 0 (seed 0 was picked among the rates on validation):
    ', without it ...' where such rows have more than one seed, else ''."""
    plan = r["plan"]
    rows = [x for x in _rows(r) if not _inherited(r, x) and 0 in x["seeds"] and len(x["seeds"]) > 2]
    if not rows:
        return ""
    gaps = []
    for x in rows:
        rest = [b for s, b in zip(x["seeds"], x["test_bits_per_token"]["seeds"]) if s]
        gaps.append(f"{sum(rest) / len(rest) - _ng(r, x['size'])['test_bits_per_token']:+.3f} (N = {x['size']:,})")
    width = (plan.get("rate_widths") or ["tutorial"])[0]
    return (f"; without seed 0 the {width} width's gaps over seeds 1 and 2 are " + ", ".join(gaps)
            + " bits/token (no paired interval computed for them)")


def _rate_search(r):
    """Where the dropout rate was searched, which it chose, and whether the choice lies on the grid's edge
    (a rate beyond it was not tried): computed from the plan's grids and the chosen rates."""
    plan, chosen = r["plan"], r["rates"]
    width = (plan.get("rate_widths") or ["tutorial"])[0]
    parts, edge = [], []
    for n, grid in sorted(plan["rates"].items(), key=lambda t: int(t[0])):
        got = chosen.get(width, {}).get(n)
        parts.append(f"N = {int(n):,}: {got} of {', '.join(map(str, grid))}")
        if got in (min(grid), max(grid)):
            edge.append(f"N = {int(n):,}")
    where = (f"; on the grid's edge at {kit.and_join(edge)}: a rate beyond it was not tried" if edge
             else "; inside the grid everywhere")
    rest = "; a size or width not searched takes the rate searched at its size, else at the largest searched size below"
    return f"{width} width, seed 0: " + "; ".join(parts) + where + rest


def _multi(r, n):
    """More than one width ran at size n (only then is one 'preferred')."""
    return len({x["width"] for x in r["rows"] if x["size"] == n}) > 1


def _pref_label(r, x):
    return " (preferred)" if x.get("preferred_by_validation") and _multi(r, x["size"]) else ""


def _inherited(r, x):
    """The row's dropout rate was not searched for its width and size but taken from a searched one."""
    return not (x["width"] in (r["plan"].get("rate_widths") or []) and str(x["size"]) in r["plan"]["rates"])


def _runs_of(r, x):
    return [t for t in r["transformer_runs"] if (t["size"], t["width"], t["dropout"]) == (x["size"], x["width"],
                                                                                           x["rate"])
            and t["seed"] in x["seeds"]]


def _cap_counts(r, x):
    """(the row's epoch cap, its seeds, how many ran to the cap, how many restored the cap's last epoch)."""
    runs = _runs_of(r, x)
    cap = runs[0]["recipe"]["epochs"]
    return (cap, len(runs), sum(t["chosen"]["stopped_at"] >= cap for t in runs),
            sum(t["chosen"]["epoch"] >= cap for t in runs))


def _rows(r):
    return sorted(r["rows"], key=lambda x: (x["size"], x["width"]))


def _ng(r, n):
    return r["ngram"].get(str(n))


def _missing(r, meta):
    """What the full study has that this file lacks (sizes, widths, seeds), as words."""
    full = {1000, 3000, 10000, 30000, 100000}
    have = {x["size"] for x in r["rows"]}
    widths = {x["width"] for x in r["rows"]}
    out = []
    if full - set(map(int, r["ngram"])):
        out.append("n-gram sizes " + ", ".join(f"{n:,}" for n in sorted(full - set(map(int, r["ngram"])))))
    if full - have:
        out.append("Transformer sizes " + ", ".join(f"{n:,}" for n in sorted(full - have)))
    if "wide" not in widths:
        out.append("the wide width")
    for w in sorted(widths):                    # the issue's plan: seeds 0, 1, 2 at N <= 10,000, both widths
        few = {}
        for x in r["rows"]:
            lack = sorted({0, 1, 2} - set(x["seeds"]))
            if x["width"] == w and x["size"] <= 10000 and lack:
                few.setdefault(" and ".join(map(str, lack)), []).append(x["size"])
        out += [f"seed{'s' if ' and ' in k else ''} {k} of the {w} width at N = " + ", ".join(
            f"{n:,}" for n in sorted(v)) for k, v in few.items()]
    if "wide" in widths and have - {x["size"] for x in r["rows"] if x["width"] == "wide"}:
        out.append("the wide width at N = " + ", ".join(
            f"{n:,}" for n in sorted(have - {x["size"] for x in r["rows"] if x["width"] == "wide"})))
    if not r["plan"].get("rates"):
        out.append("the dropout-rate search")
    else:
        searched = set(r["plan"].get("rate_widths") or [])
        out += [f"the dropout-rate search for the {w} width" for w in sorted(widths - searched)]
        unsearched = sorted(have - set(map(int, r["plan"]["rates"])))
        if unsearched:
            out.append("the dropout-rate search at N = " + ", ".join(f"{n:,}" for n in unsearched))
    cut = r["plan"].get("max_epochs_at") or {}
    if cut:                                     # the issue's recipe: early stopping on validation at every size
        out.append("early stopping beyond the epoch caps cut to " + ", ".join(
            f"{e} at N = {int(n):,}" for n, e in sorted(cut.items(), key=lambda t: int(t[0]))))
    if not r.get("core_check"):
        out.append("the core check")
    if r["plan"].get("n_samples", 0) < FULL_SAMPLES:
        out.append(f"the {FULL_SAMPLES:,} samples per model (this run: {r['plan'].get('n_samples', 0):,})")
    return out


def _cut_cell(r, x):
    """'; cap cut to E epochs' for a row at a size whose epoch cap the plan cut, else ''."""
    e = (r["plan"].get("max_epochs_at") or {}).get(str(x["size"])) or (r["plan"].get("max_epochs_at") or {}).get(
        x["size"])
    return f"; cap cut to {e} epochs" if e else ""


def _table(r):
    rows = []
    for x in _rows(r):
        ng = _ng(r, x["size"])
        pb = x["paired_bootstrap"]
        rows.append([f"{x['size']:,}", x["width"] + _pref_label(r, x),
                     f"{x['n_params']:,}", f"{x['rate']}" + (" (inherited)" if _inherited(r, x) else ""),
                     ", ".join(f"{b:.3f}" for b in x["test_bits_per_token"]["seeds"]),
                     f"{ng['test_bits_per_token']:.3f} (order {ng['n']})", f"{x['gap_bits_per_token']:+.3f}",
                     f"{x['seed_spread']:.3f}" if len(x["seeds"]) > 1 else "– (one seed" + _cut_cell(r, x) + ")",
                     f"[{pb['ci_low']:+.2f}, {pb['ci_high']:+.2f}]", _verdict_words(x)])
    only = [n for n in sorted(map(int, r["ngram"])) if n not in {x["size"] for x in r["rows"]}]
    for n in only:
        ng = _ng(r, n)
        rows.append([f"{n:,}", "–", "–", "–", "not run in this mode",
                     f"{ng['test_bits_per_token']:.3f} (order {ng['n']})", "–", "–", "–", "–"])
    return kit.table(["N", "width", "parameters", "dropout", "test bits/token per seed", "n-gram bits/token",
                      "gap", "seed spread", "paired 95% (bits/molecule; seeds pooled, molecules resampled)",
                      "verdict"], rows)


def _rates(s):
    """Validity and uniqueness over the samples, novelty over the unique valid ones (its n beside it), each with
    its 95 % Wilson interval (``report_kit.rate_ci``)."""
    n, u = s["n"], s["n_unique_valid"]
    novel = round(s["novelty"] * u) if s["novelty"] is not None else 0
    return [kit.rate_ci(s["n_valid"], n), kit.rate_ci(u, n), f"{kit.rate_ci(novel, u)} (n {u:,})" if u else "–"]


def _fcd_cell(s):
    """FCD with the n of valid molecules it used; beside it the matched-n FCD where the file has it."""
    f, m = s["fcd"] or {}, s.get("fcd_matched")
    cell = f"{kit.fmt(f.get('fcd'), '.2f')} (n {f.get('n', 0):,})"
    return cell + (f"; matched {kit.fmt(m.get('fcd'), '.2f')} (n {m['n']:,})" if m else "")


def _ring_cell(s):
    """The share of valid molecules with a ring larger than the subset's largest, Wilson interval, its n."""
    share, n = s["share_ring_larger_than_train"], s["n_valid"]
    return f"{kit.rate_ci(round(share * n), n)} (n {n:,})" if n and share is not None else "–"


def _model(s):
    return "n-gram" if s["model"] == "ngram" else s["model"]


def _sampling_table(r):
    rows = [[f"{s['size']:,}", _model(s), f"{s['n_samples']:,}", *_rates(s), _fcd_cell(s),
             f"{kit.fmt((s['kl'] or {}).get('score'))} (n {(s['kl'] or {}).get('number_samples', 0):,})",
             _ring_cell(s), kit.fmt(s["ks_heavy_atoms_vs_test"])] for s in r["sampling"]]
    rows += [["1.58 M (MOSES, published)", name, f"{MOSES_N:,} a run", f"{v:.3f} (their mean)", "–", "–",
              f"{f:.3f} (their mean; on the valid ones of {MOSES_N:,}, against their full test set)", "–", "–", "–"]
             for name, v, f in MOSES_ROWS]
    return kit.table(["N", "model", "samples", "validity", "uniqueness", "novelty", "FCD vs test", "GuacaMol KL",
                      "ring > training max", "heavy-atom KS vs test"], rows)


def _cap_note(r, config):
    """Samples with no <eos> within the token cap count as invalid: how many, per model and size."""
    cap = (config or {}).get("max_new")
    if cap is None or not all("no_eos" in s for s in r["sampling"]):
        return []
    return ["", f"A sample that has not ended with <eos> within {cap} tokens counts as invalid; such samples: "
            + "; ".join(f"N = {s['size']:,} {_model(s)}: {s['no_eos']:,}" for s in r["sampling"]) + "."]


def _sampling_notes(r):
    """What the sampling table's columns mean, and why its FCD is not MOSES's."""
    matched = any(s.get("fcd_matched") for s in r["sampling"])
    variants = kit.and_join(sorted({g["variant"] for g in r["ngram"].values()}))
    return ["Uniqueness: unique valid molecules / all samples; novelty: the unique valid molecules not in that "
            "size's training subset (canonical SMILES), over the unique valid ones (its n beside it). FCD and "
            "GuacaMol KL are computed on the n in each cell (FCD: the valid molecules; KL: the unique valid ones): "
            "FCD is biased upward at small n, so these are not comparable with MOSES's published FCD on 30,000 "
            "samples; KL depends on n too and has no matched version here. The heavy-atom KS is over the valid "
            "molecules (the FCD cell's n) against the test sample. "
            + ("\"Matched\": every model of a size on the same number of valid molecules (the smallest valid count "
               "among them, a seeded subsample)." if matched else
               "This file predates the matched-n FCD (every model of a size on the same number of valid "
               "molecules)."), "",
            f"MOSES's rows: their means over runs of {MOSES_N:,} samples (Polykovskiy et al. 2020); the spread over "
            f"their runs is theirs and not shown here, and no interval of ours is computed for them. Their NGram is "
            f"character-level with additive smoothing; ours uses atom tokens and {variants} Kneser-Ney."]


def _data_lines(r):
    d = r["data"]
    v = d["vocab"]
    return [f"Data: MOSES train ({d['n_train_file']:,} molecules), one shuffle (seed {d['shuffle_seed']}), subsets the "
            f"first N; {d['n_valid']:,} validation molecules after the largest subset; {d['n_test']:,} test molecules "
            f"(seed {d['test_seed']}); bits/token over their {d['test_tokens']:,} predicted tokens (<eos> included). "
            f"Unknown tokens: {d['unknown_rule']}. Vocabulary (specials included) and test SMILES tokens (no <eos>) "
            "outside it: " + "; ".join(f"N = {int(n):,}: {x['size']} ids, {x['test_unknown_tokens']} of "
                                              f"{x['test_tokens']:,} ({100 * x['test_unknown_share']:.4f} %)"
                                              for n, x in v.items()) + "."]


def reading(r):
    """The bullets: the verdict per size, the crossover against §11's rule, the trend of the gap, the core check."""
    out = []
    rows = [x for x in _rows(r) if x.get("preferred_by_validation")]
    if rows:
        out.append("Verdict per size and width (the project's rule: paired interval excludes 0 and the gap exceeds "
                   "the seed spread; \"preferred\": the width validation prefers at that size): " + "; ".join(
                       f"N = {x['size']:,} {x['width']}{_pref_label(r, x)}: "
                       f"{_verdict_words(x)} (gap {x['gap_bits_per_token']:+.3f} bits/token, "
                       f"{kit.seeds_word(len(x['seeds']))})" for x in _rows(r)) + ".")
    c = _crossover(r)
    if c["first_better_size"]:
        out.append(_better_sentence(c, r))
    elif c["first_below_one_seed"]:
        out.append(f"At N = {c['first_below_one_seed']:,} the Transformer is below the n-gram by the paired interval "
                   f"alone ({kit.ONE_SEED_NOTE}): no size is 'better' by the project's rule in this run.")
    elif c["gaps"]:
        g = c["gaps"]
        trend = g[-1]["gap"] - g[0]["gap"]
        word = ("flat" if abs(trend) < TREND_FLAT else "narrowing" if trend < 0 else "widening")
        rule = (f"so on MOSES the Transformer needs more than {g[-1]['size']:,} molecules, beyond §11.3's about "
                f"{SECTION_11_RULE:,}" if g[-1]["size"] >= SECTION_11_RULE else
                f"these sizes all lie below §11.3's about {SECTION_11_RULE:,}: no test of its rule")
        out.append(f"Never better up to N = {g[-1]['size']:,} in this run: the gap goes from {g[0]['gap']:+.3f} "
                   f"(N = {g[0]['size']:,}) to {g[-1]['gap']:+.3f} bits/token, {word} (threshold {TREND_FLAT} "
                   f"bits/token); {rule}.")
    out += _cap_lines(r)
    out += _sampling_reading(r)
    ck = r.get("core_check")
    if ck:
        f64 = "float64" in ck["bridge_engine"] and "float64" in ck["core_engine"]
        out.append(f"Core check at N = {ck['size']:,} ({ck['n_train']:,} molecules, {ck['epochs']} epochs, no "
                   f"dropout{', both engines in float64' if f64 else ''}: one trajectory trained twice, not the "
                   f"study's recipe): pure-Python core {ck['core_test_bits_per_token']:.6f}, bridge "
                   f"{ck['bridge_test_bits_per_token']:.6f} bits/token, |difference| {ck['abs_diff']:.1e} "
                   f"(threshold 1e-6): " + ("the core and the bridge are one model. " if ck["agree"] else
                                            "they DISAGREE. ")
                   + (f"The study's rows come from the bridge in {_engine_dtype(r)}, which this check does not "
                      "cover." if _engine_dtype(r) not in ck["bridge_engine"] else ""))
    return out


def _engine_dtype(r):
    return "float32" if "float32" in (r.get("engine") or "") else "float64"


def _sampling_reading(r):
    """One bullet: per size run by more than one model, each model's validity with its 95 % Wilson interval
    and whether every pair of those intervals is apart (uniqueness and novelty, with theirs, are in the
    sampling table)."""
    parts = []
    for n in sorted({s["size"] for s in r["sampling"]}):
        rows = [s for s in r["sampling"] if s["size"] == n]
        if len(rows) < 2:
            continue
        ivs = [kit.evaluation.wilson_interval(s["n_valid"], s["n"]) for s in rows]
        apart = all(a[1] < b[0] or b[1] < a[0] for i, a in enumerate(ivs) for b in ivs[i + 1:])
        parts.append(f"N = {n:,}: " + ", ".join(f"{'n-gram' if s['model'] == 'ngram' else s['model']} "
                                                 f"{kit.rate_ci(s['n_valid'], s['n'])}" for s in rows)
                     + (" (every pair of intervals apart)" if apart else " (some intervals overlap)"))
    if not parts:
        return []
    n = sorted({s["n"] for s in r["sampling"]})
    head = (f"Validity of free samples at τ = 1 ({kit.and_join([f'{x:,}' for x in n])} samples from one trained "
            "model per width and size, seed 0, and the n-gram; 95 % Wilson intervals: the sampling's noise, not the "
            "training seed's; uniqueness and novelty, with theirs, in the sampling table): ")
    cut = sorted(int(n) for n in (r["plan"].get("max_epochs_at") or {}))
    return [head + "; ".join(parts) + "." + (
        f" The Transformers at N = {kit.and_join([f'{n:,}' for n in cut])} come from one-seed runs whose epoch caps "
        "were cut (the table above): their samples are not those of fully trained models." if cut else "")]


LEGACY = {"better": "lower", "worse": "higher"}


def _verdict_words(row):
    """A size's verdict; one seed ('lower_one_seed' / 'higher_one_seed', or a file written before those codes)
    rests on the paired interval alone (``report_kit``'s words for such a comparison)."""
    v = row["verdict"]
    if v.endswith("_one_seed"):
        return kit.ONE_SEED_WORDS[v.split("_")[0]].strip(", ")
    if len(row["seeds"]) == 1 and v != "level":
        return kit.ONE_SEED_WORDS[LEGACY[v]].strip(", ")
    return v


def _crossover(r):
    """results.crossover with the one-seed rule applied (a file written before it may call a one-seed size
    'better'): 'better' needs more than one seed; a one-seed 'better' is ``first_below_one_seed``."""
    c = dict(r["crossover"])
    c.setdefault("first_better_width", None)
    if "first_below_one_seed" not in c:
        rows = {x["size"]: x for x in r["rows"] if x.get("preferred_by_validation")}
        first = c["first_better_size"]
        single = first is not None and len(rows[first]["seeds"]) == 1
        c["first_better_size"], c["first_below_one_seed"] = (None, first) if single else (first, None)
    return c


def _cap_lines(r):
    """Per row, how many seeds ran to the epoch cap and how many restored its last epoch (those were still
    improving on validation: their number is not the model's best); then what a capped row above the n-gram
    can and cannot say (``_above_lines``)."""
    parts, above = [], []
    for x in _rows(r):
        cap, n, ran, kept = _cap_counts(r, x)
        if ran:
            best = sorted(t["chosen"]["epoch"] for t in _runs_of(r, x))
            parts.append(f"N = {x['size']:,} {x['width']}: {ran} of {n} ran to the cap ({cap} epochs) without early "
                         f"stopping firing, best epoch {best[0]}" + (f"–{best[-1]}" if best[-1] != best[0] else "")
                         + f", {kept} of them restored the cap's last epoch")
            if x["gap_bits_per_token"] > 0:
                above.append((x, cap))
    if not parts:
        return []
    out = ("Epoch caps (experiment 4's 40 epochs; the plan's caps at the largest sizes): " + "; ".join(parts)
           + ". A run that restored the cap's last epoch was still improving on validation: its number is not the "
           "model's best, and where such a row is better than the n-gram, the verdict is the conservative one.")
    return [out + _above_lines(r, above) + _below_cut_lines(r)]


def _below_cut_lines(r):
    """Rows still below the n-gram where the plan cut the epoch cap (one seed each): per width, the gap from the
    largest size where it is 'better' onwards (``_trend``), the same seed's test bits/token beside the n-gram's,
    and whether those runs stopped at the cut cap still improving, so the trend may be the cap's."""
    cut = {int(n) for n in (r["plan"].get("max_epochs_at") or {})}
    out = ""
    for w in sorted({x["width"] for x in r["rows"]}):
        rows = [x for x in _rows(r) if x["width"] == w and x["size"] in cut and x["gap_bits_per_token"] < 0]
        better = [x for x in _rows(r) if x["width"] == w and x["verdict"] == "better"
                  and x["size"] < min((y["size"] for y in rows), default=0)]
        if not rows or not better:
            continue
        chain, seed = [better[-1]] + rows, rows[0]["seeds"][0]
        if not all(seed in x["seeds"] for x in chain):
            continue
        bits = ", ".join(f"{x['test_bits_per_token']['seeds'][x['seeds'].index(seed)]:.3f}" for x in chain)
        ngram = ", ".join(f"{_ng(r, x['size'])['test_bits_per_token']:.3f}" for x in chain)
        kept = sum(_cap_counts(r, x)[3] for x in rows)
        out += (f" Below the n-gram after a cut cap: the {w} width at " + kit.and_join(
            [f"N = {x['size']:,} ({_cap_counts(r, x)[0]} epochs, gap {x['gap_bits_per_token']:+.3f})" for x in rows])
            + f", one seed each; its gap from N = {better[-1]['size']:,} ({better[-1]['gap_bits_per_token']:+.3f}, "
            f"the largest size where it is better) on: {_trend(chain)} (threshold {TREND_FLAT}); seed {seed}'s test "
            f"bits/token {bits} against the n-gram's {ngram}; {kept} of these {len(rows)} runs stopped at the cut cap "
            "still improving on validation" + (", so whether the trend is the caps' or the data's is not settled by "
                                               "this run." if kept else "."))
    return out


def _above_lines(r, above):
    """Rows above the n-gram after their cap: their width (and the widths not run there), their cap and molecule
    passes against the largest 'better' size's, the same seed's bits/token at both sizes (rising on a superset
    of the data, or falling slower than the n-gram's), and the sign change this makes, which gets no number."""
    better = [x for x in _rows(r) if x["verdict"] == "better"]
    if not above or not better:
        return ""
    cut = {int(n) for n in (r["plan"].get("max_epochs_at") or {})}
    sizes = {x["size"] for x, _ in above}
    absent = sorted({y["width"] for y in r["rows"]} - {y["width"] for y in r["rows"] if y["size"] in sizes})
    out = (" Above the n-gram after the cap: " + kit.and_join(
        [f"N = {x['size']:,}, the {x['width']} width ({kit.seeds_word(len(x['seeds']))}, "
         + (f"its cap cut to {cap} epochs" if x["size"] in cut else f"{cap} epochs")
         + f", {x['size'] * cap:,} molecule passes)" for x, cap in above])
        + (f"; the {kit.and_join(absent)} width{'s' if len(absent) > 1 else ''} did not run there" if absent else ""))
    for x, cap in above:
        b = max((y for y in better if y["width"] == x["width"] and y["size"] < x["size"]), key=lambda y: y["size"],
                default=None)
        if b is None:
            continue
        out += _against_smaller(r, x, b, cap)
    widths = {x["width"] for x, _ in above}
    first_above = min(x["size"] for x, _ in above)
    below = [y["size"] for y in better if y["size"] < first_above and y["width"] in widths]
    if below:
        whose = "widths'" if len(widths) > 1 else "width's"
        out += (f". So the {kit.and_join(sorted(widths))} {whose} gap changes sign between N = {max(below):,} and "
                f"{first_above:,}; that change is not interpolated as a crossover: the sizes above it have one seed "
                "each" + (" and cut epoch caps" if cut & sizes else "") + ", and whether more epochs"
                + (f", or the {kit.and_join(absent)} width," if absent else "") + " would close the gap is not "
                "settled by this run")
    return out + "."


def _against_smaller(r, x, b, cap):
    """One capped row above the n-gram against the largest size where its width is better: molecule passes, the
    same seed's test bits/token at both sizes (a superset of the data), and the n-gram's at both."""
    passes = b["size"] * max(t["chosen"]["stopped_at"] for t in _runs_of(r, b))
    seed = x["seeds"][0] if len(x["seeds"]) == 1 and x["seeds"][0] in b["seeds"] else None
    if seed is None:
        were, now, who = b["test_bits_per_token"]["mean"], x["test_bits_per_token"]["mean"], "its seed mean"
    else:
        were, now = b["test_bits_per_token"]["seeds"][b["seeds"].index(seed)], x["test_bits_per_token"]["seeds"][0]
        who = f"seed {seed}'s test bits/token"
    ng0, ng1 = (_ng(r, n)["test_bits_per_token"] for n in (b["size"], x["size"]))
    out = (f". At N = {x['size']:,}, the {x['width']} width had {x['size'] * cap:,} molecule passes against {passes:,} "
           f"at N = {b['size']:,} (the largest size where it is better); {who} ")
    if now > were:
        return out + (f"rose from {were:.3f} to {now:.3f} on a superset of that size's data: consistent with the "
                      "cap, not the data, limiting this point")
    still = any(t["chosen"]["epoch"] >= cap for t in _runs_of(r, x))
    return out + (f"fell from {were:.3f} to {now:.3f}, the n-gram's faster ({ng0:.3f} to {ng1:.3f})"
                  + (", the Transformer's validation still falling at its cap" if still else ""))


def _trend(rows):
    """How a width's gap moves between consecutive sizes: 'widening' (more negative by at least TREND_FLAT),
    'narrowing' or 'flat', one word per step."""
    words = []
    for a, b in zip(rows, rows[1:]):
        d = b["gap_bits_per_token"] - a["gap_bits_per_token"]
        words.append(f"{'flat' if abs(d) < TREND_FLAT else 'narrowing' if d > 0 else 'widening'} from "
                     f"{_k(a['size'])} to {_k(b['size'])}")
    return ", ".join(words)


def _better_sentence(c, r):
    """The crossover, when a size is 'better': every width better there (validation's choice first), where,
    how sure (seeds), against §11.3's rule (its qualifiers and its unit), and each such width's gap trend."""
    first = c["first_better_size"]
    better = sorted((x for x in r["rows"] if x["size"] == first and x["verdict"] == "better"),
                    key=lambda x: not x.get("preferred_by_validation"))
    widths = "; ".join(f"{x['width']}{_pref_label(r, x)}: {kit.seeds_word(len(x['seeds']))}, gap "
                       f"{x['gap_bits_per_token']:+.3f} bits/token" for x in better)
    if c["below_at_smallest"]:
        where = (f"Already better at the smallest size run, N = {first:,} ({widths}): the crossover lies at or below "
                 f"N = {first:,}, and no pair of sizes brackets it, so there is nothing to interpolate")
    elif c["interpolated"]:
        lo, hi = (kit.fmt(x, ",.0f") for x in c["range"])
        where = (f"First better at N = {first:,} ({widths}); the seed-mean gap changes sign at N ≈ "
                 f"{c['interpolated']:,.0f} (log-N interpolation; seeds {lo} – {hi})")
    else:
        where = f"First better at N = {first:,} ({widths}); the seed-mean gap has no sign change to interpolate"
    per = _targets_per_molecule(r)
    rule = (f"§11.3 lists small data (under about {SECTION_11_RULE:,} effective training samples and no pre-trained "
            "model to fine-tune) among its reasons to drop a plain Transformer, from scratch \"almost always\" losing "
            "to classical methods (the advice holds when two or more reasons do); here a molecule gives "
            + (f"about {per:.0f} next-token targets (the test molecules' mean)" if per else "many next-token targets")
            + " and the baseline is an n-gram, so §11.3's samples and these molecules need not be one unit")
    rule += ("; this run, already better at its smallest size, does not test that rule" if c["below_at_smallest"]
             else "")
    rule += ("; experiment 4 (the question above) found the opposite of this run near that count (the n-gram "
             "better at 902 ESOL molecules), with another data set and split (a scaffold split), its own dropout "
             "rate and float64: the count alone does not decide")
    for x in better:
        same = [y for y in _rows(r) if y["width"] == x["width"] and y["verdict"] == "better"]
        if len(same) > 1:
            rule += (f". Where it is better, the {x['width']} width's gap goes " + ", ".join(
                f"{y['gap_bits_per_token']:+.3f}" for y in same) + f" bits/token (N = {_k(same[0]['size'])} to "
                f"{_k(same[-1]['size'])}): {_trend(same)} (threshold {TREND_FLAT})")
    pref = next((x for x in r["rows"] if x["size"] == first and x.get("preferred_by_validation")), None)
    beside = (f" The width that validation prefers there ({pref['width']}, {kit.seeds_word(len(pref['seeds']))}), "
              f"against the n-gram: {_verdict_words(pref)} (gap {pref['gap_bits_per_token']:+.3f} bits/token)."
              if pref is not None and pref not in better else "")
    return f"{where}. {rule}.{beside}"


def _targets_per_molecule(r):
    """Predicted test tokens (<eos> included) per test molecule; None where the file lacks the data record."""
    d = r.get("data") or {}
    return d["test_tokens"] / d["n_test"] if d.get("n_test") else None


def page(payload):
    r = payload["results"]
    miss = _missing(r, payload)
    mode = payload.get("mode")
    head = ([_mode_line(mode, miss), ""] if miss else []) + [_held(r, payload.get("config")), ""]
    comparison = head + _data_lines(r) + ["", "Test bits/token (primary metric) per size and model:", ""] + _table(r)
    extras = (["Free samples at τ = 1 (seed 0; MOSES's published rows are theirs, on other sample counts and the full "
               "training set):", ""] + _sampling_table(r) + [""] + _sampling_notes(r)
              + _cap_note(r, payload.get("config")) + _budget_line(payload)
              + ["", "Measured training speed (molecules/s, validation scoring included; one thread a job; the host's "
                 "load during each job is not recorded, so speeds compare only roughly): "
                 + "; ".join(f"{s['width']} N = {s['size']:,} seed {s['seed']} dropout {s['rate']}: "
                             f"{s['molecules_per_s']:.0f} ({s['epochs_run']} epochs)"
                             for s in sorted(r["speeds"], key=lambda s: (s["width"], s["size"], s["seed"], s["rate"])))
                 + ".",
                 "", "n-gram peak memory in MiB (traced: the chosen model refitted and scoring; process: the fitting "
                 "process's peak resident memory, the search and the loaded MOSES file included, so it has the same "
                 "floor at every size): " + "; ".join(
                     f"N = {int(n):,}: traced {g['peak_memory_mb']:,.0f}, process " + (
                         f"{g['process_maxrss_mb']:,.0f}" if g.get("process_maxrss_mb") is not None else
                         "– (the file predates that field)")
                     for n, g in sorted(r["ngram"].items(), key=lambda t: int(t[0]))) + "."])
    return kit.Page(comparison, reading(r), differences(r), extras, ["data_hunger_bits", "data_hunger_sampling"])


RECORDED_WALL_STRICT = True       # recorded_wall_s never exceeds one call's wall time (report_kit._wall_cell)


def recorded_wall_s(r):
    """A lower bound of the run's wall time from the job times its results record, every call's (report_kit's
    overview gives it for a resumed run, whose own wall time is its last call's): per timed stage, two jobs at
    a time, at least the longest job and at least half their sum (``demo_data_hunger.job_times``)."""
    import demo_data_hunger as dh
    return sum(max(max(ts), sum(ts) / 2) for ts in dh.job_times(r) if ts)


def _budget_line(payload):
    """The extended run's wall time against the issue's budget (``BUDGET_S``): the whole run's (its recorded lower
    bound when resumed), the stage estimate at the host speed measured at the start (and at the speed the rates
    were measured at), and how the recorded job times compare with their estimate (a shared or slower host)."""
    import demo_data_hunger as dh
    r, speed = payload["results"], (payload.get("matmul_mflops") or {}).get("start")
    if payload.get("mode") != "extended" or not speed or "plan" not in r:
        return []
    plan, wall = dh.plan_from_results(r), payload["wall_time_s"]
    bound = max(wall, recorded_wall_s(r)) if payload.get("resumed_stages") else wall
    est = sum(dh.stage_estimates(payload["config"], plan, speed))
    ngram, searched, rest, core_s, sampled = dh.job_times(r)
    timed = (dh.two_at_a_time(ngram) + dh.two_at_a_time(searched) + dh.two_at_a_time(rest) + sum(core_s)
             + dh.two_at_a_time(sampled))
    timed_est = sum(dh.stage_estimates(payload["config"], plan, speed)[1:5])
    over = bound > dh.BUDGET_S
    return ["", f"Wall time against the budget: the whole run {'at least ' if bound > wall else ''}{kit.minutes(bound)}"
            f" against the issue's about {kit.minutes(dh.BUDGET_S)} for `--extended`: "
            + (f"over it by {100 * (bound / dh.BUDGET_S - 1):.0f} %" if over else "within it")
            + f". The stage estimate for this plan: {kit.minutes(est)} at the {speed:.1f} Mflop/s measured at the "
            f"{'last call' if payload.get('resumed_stages') else 'run'}'s start, "
            f"{kit.minutes(est * speed / dh.RATES_MFLOPS)} at the {dh.RATES_MFLOPS:.0f} Mflop/s its rates were "
            f"measured at; the recorded job times of its timed stages sum, two at a time, to "
            f"{abs(100 * (timed / timed_est - 1)):.0f} % {'above' if timed > timed_est else 'below'} their estimate "
            f"at {speed:.1f} Mflop/s (a host shared or slower during a job shows here)."]


def _mode_line(mode, miss):
    """What this run leaves out: a default run points to --extended; the extended plan names its own cuts."""
    if mode == "extended":
        return (f"**This is the extended run, its plan cut from the issue's for time (the results' plan; the wall "
                f"time against the budget: below the sampling table); not in it: "
                f"{kit.and_join(miss)}.**")
    article = "an" if str(mode)[:1] in "aeiou" else "a"
    return (f"**This is {article} {mode}-mode run; not in it: {kit.and_join(miss)}.** The full study is "
            "`python demos/demo_data_hunger.py --extended`.")


def headline(r):
    c = _crossover(r)
    sizes = ", ".join(f"{n:,}" for n in c["sizes_run"])
    if c["first_better_size"]:
        ours = _better_headline(r, c)
    elif c["first_below_one_seed"] and len(c["sizes_run"]) == 1:
        ours = _one_size_headline(r, c["first_below_one_seed"])
    elif c["first_below_one_seed"]:
        ours = (f"Transformer below the n-gram from N = {c['first_below_one_seed']:,} by the paired interval alone "
                f"({kit.ONE_SEED_NOTE}; sizes run: {sizes})")
    elif c["gaps"]:
        ours = (f"not better up to N = {c['gaps'][-1]['size']:,} (gap {c['gaps'][-1]['gap']:+.2f} bits/token); "
                f"sizes run: {', '.join(f'{n:,}' for n in c['sizes_run'])}")
    else:
        ours = "no Transformer size run"
    return ours, "§11.3: not below ~1,000 samples (untested)"


def _k(n):
    """1000 -> '1k' (the overview row's compact sizes)."""
    return f"{n // 1000}k" if n % 1000 == 0 else f"{n:,}"


def _better_headline(r, c):
    """The overview row when some width is 'better': that width (and every other width better at the same sizes
    with as many seeds, named together), the sizes, the crossover, and the sizes where a row is above the
    n-gram, with their widths when several widths were named."""
    w = c["first_better_width"]
    row = next(x for x in r["rows"] if x["size"] == c["first_better_size"] and (
        x["width"] == w if w else x.get("preferred_by_validation")))

    def better_at(width):
        return [x["size"] for x in _rows(r) if x["width"] == width and x["verdict"] == "better"]
    better, seeds = better_at(row["width"]), kit.seeds_word(len(row["seeds"]))
    same = [x["width"] for x in r["rows"] if x["size"] == row["size"] and x is not row
            and better_at(x["width"]) == better and len(x["seeds"]) == len(row["seeds"])]
    every = len({x["width"] for x in r["rows"]}) == len(same) + 1
    who = (f"{row['width']} width ({seeds}) beats" if not same else
           f"{'both' if every and not same[1:] else ' and '.join([row['width']] + same)} widths ({seeds}) beat")
    ours = (f"{who} the tuned n-gram at " + ", ".join(map(_k, better)) + ": crossover "
            + (f"≤ {_k(c['first_better_size'])}" if c["below_at_smallest"] else f"from {_k(c['first_better_size'])}"))
    lower = [x for x in _rows(r) if x["verdict"] == "lower_one_seed" and x["size"] > max(better)]
    above = [x for x in _rows(r) if x["verdict"] in ("worse", "higher_one_seed")]
    beyond = lower + above
    if lower and all(len(x["seeds"]) == 1 for x in beyond) and len({
            tuple(x["size"] for x in beyond if x["width"] == w) for w in {x["width"] for x in beyond}}) == 1:
        sizes = sorted({x["size"] for x in beyond})                                   # one size set, one seed each
        return ours + (f"; at {', '.join(map(_k, sizes))} (1 seed{_capped_word(r, beyond)}): " + ", ".join(
            f"{w} {'below' if any(x['width'] == w for x in lower) else 'above'}"
            for w in sorted({x["width"] for x in beyond}, key=lambda w: not any(x["width"] == w for x in lower)))
            + " the n-gram")
    if lower:                                   # beyond the 'better' sizes, one seed: by the paired interval alone
        ours += "; " + "; ".join(
            f"{w} below it at " + ", ".join(_k(x["size"]) for x in lower if x["width"] == w) + " (1 seed)"
            for w in sorted({x["width"] for x in lower}))
    if above:
        ran = sorted({x["width"] for x in above})
        there = {x["width"] for x in r["rows"] if x["size"] in {y["size"] for y in above}}
        only = there == set(ran) and len(ran) < len({x["width"] for x in r["rows"]})   # no other width ran there
        named = (f"{'/'.join(ran)} width{'s' if len(ran) > 1 else ''}{' only' if only else ''}, " if same or only
                 else "")
        ours += ("; n-gram lower at " + ", ".join(_k(x["size"]) for x in above)
                 + f" ({named}{kit.and_join(sorted({kit.seeds_word(len(x['seeds'])) for x in above}))}"
                 + f"{_capped_word(r, above)})")
    return ours


def _capped_word(r, rows):
    """', epochs cut' when every run of ``rows`` ran to an epoch cap the plan cut below experiment 4's (its
    max_epochs_at), ', capped' when they ran to the usual cap, '' otherwise."""
    if not all(_cap_counts(r, x)[2] == _cap_counts(r, x)[1] for x in rows):
        return ""
    cut = {int(n) for n in (r["plan"].get("max_epochs_at") or {})}
    return ", epochs cut" if all(x["size"] in cut for x in rows) else ", capped"


def _one_size_headline(r, n):
    """The overview row when one Transformer size was run: the metric, both models, and sample validity."""
    row = next(x for x in r["rows"] if x["size"] == n and x.get("preferred_by_validation"))
    ng = row["test_bits_per_token"]["mean"] - row["gap_bits_per_token"]
    val = {s["model"]: s for s in r["sampling"] if s["size"] == n}
    t, g = val.get(row["width"]), val.get("ngram")
    tail = (f"; validity {kit.rate_ci(t['n_valid'], t['n'])} vs {kit.rate_ci(g['n_valid'], g['n'])}"
            if t and g else "")
    words = _verdict_words(row).replace(", by the", " by").replace(" alone,", " alone")
    return (f"bits/token at N = {n:,} only: Transformer {row['test_bits_per_token']['mean']:.3f} vs n-gram "
            f"{ng:.3f}, {words} (one seed){tail}")


# ----------------------------------------------------------------------------- figures


def _colour(model):
    """One colour per model in both figures: the n-gram black, the widths C0, C1 ..."""
    return "k" if model == "ngram" else f"C{['tutorial', 'wide'].index(model) if model in ('tutorial', 'wide') else 2}"


def fig_bits(meta, r, out_dir):
    plt = kit.plt()
    fig, a = plt.subplots(figsize=(7.2, 4.6))
    ns = sorted(map(int, r["ngram"]))
    a.plot(ns, [r["ngram"][str(n)]["test_bits_per_token"] for n in ns], "ks-", label="n-gram (Kneser-Ney, tuned)")
    for width in sorted({x["width"] for x in r["rows"]}):
        rows, c = [x for x in _rows(r) if x["width"] == width], _colour(width)
        xs, ys = [x["size"] for x in rows], [x["test_bits_per_token"]["mean"] for x in rows]
        for (x0, y0, r0), (x1, y1, r1) in zip(zip(xs, ys, rows), list(zip(xs, ys, rows))[1:]):
            one = len(r0["seeds"]) == 1 or len(r1["seeds"]) == 1      # a segment to a one-seed point: dashed
            if not one:                                   # no line to a one-seed point: no crossover is drawn
                a.plot([x0, x1], [y0, y1], "-", color=c)
        multi = [(x, y) for x, y, w in zip(xs, ys, rows) if len(w["seeds"]) > 1]
        single = [(x, y) for x, y, w in zip(xs, ys, rows) if len(w["seeds"]) == 1]
        if multi:
            a.plot(*zip(*multi), "o", color=c, label=f"Transformer {width} (seed mean)")
        if single:
            caps = sorted({v for k, v in (r["plan"].get("max_epochs_at") or {}).items()
                           if int(k) in {x for x, _ in single}}, reverse=True)
            a.plot(*zip(*single), "o", mfc="white", color=c, label=f"Transformer {width}, one seed" + (
                f", cap cut to {'/'.join(map(str, caps))} epochs" if caps else "") + " (open)")
        if xs[-1] < ns[-1]:
            a.annotate(f"{width}: not run above {_k(xs[-1])}", (xs[-1], ys[-1]), textcoords="offset points",
                       xytext=(8, 4), fontsize=8, color=c)
        banded = [x for x in rows if len(x["seeds"]) > 1]      # a band over seeds only: none to a one-seed point
        a.fill_between([x["size"] for x in banded], [x["test_bits_per_token"]["min"] for x in banded],
                       [x["test_bits_per_token"]["max"] for x in banded], color=c, alpha=0.2)
    a.axvline(SECTION_11_RULE, color="gray", ls=":", label="§11.3: ~1,000 effective samples (its unit, not molecules)")
    a.set(xscale="log", xlabel="training molecules N (MOSES, nested)", ylabel="test bits/token",
          title="Test bits/token against N" + (" (bands: seed min-max)" if any(
              len(x["seeds"]) > 1 for x in r["rows"]) else " (one seed: no band)"))
    kit.legend_below(a)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "data_hunger_bits")


def fig_sampling(meta, r, out_dir):
    plt = kit.plt()
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.2))
    for model in sorted({s["model"] for s in r["sampling"]}):
        rows = sorted((s for s in r["sampling"] if s["model"] == model), key=lambda s: s["size"])
        xs, c = [s["size"] for s in rows], _colour(model)
        tag = "" if model == "ngram" else " (seed 0)"
        ci = [kit.evaluation.wilson_interval(s["n_valid"], s["n"]) for s in rows]
        axes[0].errorbar(xs, [s["validity"] for s in rows], yerr=[[s["validity"] - lo for s, (lo, _) in zip(rows, ci)],
                                                                 [hi - s["validity"] for s, (_, hi) in zip(rows, ci)]],
                         fmt="o-", color=c, capsize=3, label=_model(rows[0]) + tag)
        axes[1].plot(xs, [(s["fcd"] or {}).get("fcd") or float("nan") for s in rows], "o-", color=c,
                     label=_model(rows[0]) + tag)
        cut = [s for s in rows if model != "ngram" and str(s["size"]) in (r["plan"].get("max_epochs_at") or {})]
        for a, key in ((axes[0], "validity"), (axes[1], None)):
            a.plot([s["size"] for s in cut], [s[key] if key else (s["fcd"] or {}).get("fcd") or float("nan")
                                               for s in cut], "o", mfc="white", color=c, zorder=3)
    caps = "/".join(str(v) for _, v in sorted((r["plan"].get("max_epochs_at") or {}).items(), key=lambda t: int(t[0])))
    axes[0].set(xscale="log", xlabel="N", ylabel="validity", title="Validity of free samples (τ = 1, 95 % Wilson)"
                + (f"\nopen: a Transformer whose epoch cap was cut to {caps}" if caps else ""))
    axes[1].set(xscale="log", yscale="log", xlabel="N", ylabel="FCD vs test",
                title="FCD vs the test sample (each on its own valid n: biased up at small n;\n"
                      "the table's matched FCD compares a size's models on one n)")
    for a in axes:
        kit.legend_below(a)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "data_hunger_sampling")


FIGURES = [fig_bits, fig_sampling]
