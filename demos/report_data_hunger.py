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
            "the next section). The tutorial has no such experiment; its §11.3 rule of thumb is that under about "
            f"{SECTION_11_RULE:,} training samples a Transformer from scratch loses to classical methods.")
DIFFERENCES = [
    "The tutorial has no such experiment: §11.3's \"about a thousand samples\" is the comparison, not a number it "
    "measured.",
    "MOSES's CharRNN and NGram rows are theirs: 30,000 samples from models trained on all 1.58 M molecules, an "
    "additive-smoothing n-gram; ours are tuned Kneser-Ney n-grams and Transformers on at most 100,000 molecules.",
    "The tutorial width's parameter count differs from 39,360 only through the vocabulary (each subset's own, "
    "the table's column).",
    "The Transformer trains in float32 through torch_bridge (the ladder's recipe, experiment 4).",
]


def differences(r):
    """DIFFERENCES, and the core check's sentence only where the run holds one."""
    ck = r.get("core_check")
    if not ck:
        return DIFFERENCES
    return DIFFERENCES[:-1] + [DIFFERENCES[-1][:-1] + "; the core check shows the pure-Python core and the bridge "
                               + ("are one model." if ck["agree"] else "DISAGREE.")]


def _held(r):
    """What this run holds, built from its plan and rows: sizes and widths run, how the dropout rate and the
    epochs were chosen (the question's second half)."""
    plan, rows = r["plan"], _rows(r)
    runs = r["transformer_runs"]
    widths = "; ".join(f"{w} width at N = " + ", ".join(f"{int(n):,}" for n in sorted(map(int, by)))
                       for w, by in plan["widths"].items())
    ngram = ", ".join(f"{int(n):,}" for n in sorted(map(int, r["ngram"])))
    rate = ("the dropout rate chosen on validation" if plan["rates"] else
            f"dropout fixed at {kit.and_join(sorted({str(x['rate']) for x in rows}))} (not searched)")
    capped = any(t["chosen"]["epoch"] >= t["recipe"]["epochs"] for t in runs)
    stop = ("early stopping on validation, bound by the epoch cap (the chosen epoch is the cap's last)" if capped
            else "early stopping on validation")
    return (f"This run: the n-gram (order and smoothing chosen on validation) at N = {ngram}; the Transformer's "
            f"{widths}, {rate}, {stop}.")


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
    if not r.get("core_check"):
        out.append("the core check")
    if r["plan"].get("n_samples", 0) < FULL_SAMPLES:
        out.append(f"the {FULL_SAMPLES:,} samples per model (this run: {r['plan'].get('n_samples', 0):,})")
    return out


def _table(r):
    rows = []
    for x in _rows(r):
        ng = _ng(r, x["size"])
        pb = x["paired_bootstrap"]
        rows.append([f"{x['size']:,}", x["width"] + (" (preferred)" if x.get("preferred_by_validation") else ""),
                     f"{x['n_params']:,}", x["rate"], ", ".join(f"{b:.3f}" for b in x["test_bits_per_token"]["seeds"]),
                     f"{ng['test_bits_per_token']:.3f} (order {ng['n']})", f"{x['gap_bits_per_token']:+.3f}",
                     f"{x['seed_spread']:.3f}" if len(x["seeds"]) > 1 else "– (one seed)",
                     f"[{pb['ci_low']:+.2f}, {pb['ci_high']:+.2f}]", _verdict_words(x)])
    only = [n for n in sorted(map(int, r["ngram"])) if n not in {x["size"] for x in r["rows"]}]
    for n in only:
        ng = _ng(r, n)
        rows.append([f"{n:,}", "–", "–", "–", "not run in this mode",
                     f"{ng['test_bits_per_token']:.3f} (order {ng['n']})", "–", "–", "–", "–"])
    return kit.table(["N", "width", "parameters", "dropout", "test bits/token per seed", "n-gram bits/token",
                      "gap", "seed spread", "paired 95% (bits/molecule)", "verdict"], rows)


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


def _sampling_table(r):
    rows = [[f"{s['size']:,}", s["model"], f"{s['n_samples']:,}", *_rates(s), _fcd_cell(s),
             f"{kit.fmt((s['kl'] or {}).get('score'))} (n {(s['kl'] or {}).get('number_samples', 0):,})",
             _ring_cell(s), kit.fmt(s["ks_heavy_atoms_vs_test"])] for s in r["sampling"]]
    rows += [["1.58 M (MOSES, published)", name, f"{MOSES_N:,} a run", f"{v:.3f} (their mean)", "–", "–",
              f"{f:.3f} (their mean, n {MOSES_N:,})", "–", "–", "–"] for name, v, f in MOSES_ROWS]
    return kit.table(["N", "model", "samples", "validity", "uniqueness", "novelty", "FCD vs test", "GuacaMol KL",
                      "ring > training max", "heavy-atom KS vs test"], rows)


def _sampling_notes(r):
    """What the sampling table's columns mean, and why its FCD is not MOSES's."""
    matched = any(s.get("fcd_matched") for s in r["sampling"])
    variants = kit.and_join(sorted({g["variant"] for g in r["ngram"].values()}))
    return ["Uniqueness: unique valid molecules / all samples; novelty: the unique valid molecules not in that "
            "size's training subset (canonical SMILES), over the unique valid ones (its n beside it). FCD and "
            "GuacaMol KL are computed on the n in each cell (FCD: the valid molecules; KL: the unique valid ones): "
            "FCD is biased upward at small n, so these are not comparable with MOSES's published FCD on 30,000 "
            "samples. " + ("\"Matched\": every model of a size on the same number of valid molecules (the smallest "
                            "valid count among them, a seeded subsample)." if matched else
                            "This file predates the matched-n FCD (every model of a size on the same number of "
                            "valid molecules)."), "",
            f"MOSES's rows: their means over runs of {MOSES_N:,} samples (Polykovskiy et al. 2020); the spread over "
            f"their runs is theirs and not shown here, and no interval of ours is computed for them. Their NGram is "
            f"character-level with additive smoothing; ours uses atom tokens and {variants} Kneser-Ney."]


def _data_lines(r):
    d = r["data"]
    v = d["vocab"]
    return [f"Data: MOSES train ({d['n_train_file']:,} molecules), one shuffle (seed {d['shuffle_seed']}), subsets the "
            f"first N; {d['n_valid']:,} validation molecules after the largest subset; {d['n_test']:,} test molecules "
            f"(seed {d['test_seed']}). Unknown tokens: {d['unknown_rule']}. Vocabulary (specials included) and test "
            "tokens outside it: " + "; ".join(f"N = {int(n):,}: {x['size']} ids, {x['test_unknown_tokens']} of "
                                              f"{x['test_tokens']:,} ({100 * x['test_unknown_share']:.4f} %)"
                                              for n, x in v.items()) + "."]


def reading(r):
    """The bullets: the verdict per size, the crossover against §11's rule, the trend of the gap, the core check."""
    out = []
    rows = [x for x in _rows(r) if x.get("preferred_by_validation")]
    if rows:
        out.append("Verdict per size and width (the project's rule: paired interval excludes 0 and the gap exceeds "
                   "the seed spread; \"preferred\": the width validation prefers at that size): " + "; ".join(
                       f"N = {x['size']:,} {x['width']}{' (preferred)' if x.get('preferred_by_validation') else ''}: "
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
    capped = [x for x in _rows(r) if any(t["chosen"]["epoch"] >= t["recipe"]["epochs"] for t in r["transformer_runs"]
                                     if (t["size"], t["width"], t["dropout"]) == (x["size"], x["width"], x["rate"]))]
    if capped:
        out.append("The epoch cap ended training (the restored epoch is the cap's last; cap: experiment 4's 40 "
                   "epochs, the plan's caps at 30k and 100k) at "
                   + kit.and_join([f"N = {x['size']:,} {x['width']}" for x in capped])
                   + ": validation was still improving at the cap, so the Transformer's number there is not its "
                   "best." + _cap_bound(capped))
    out += _sampling_reading(r)
    ck = r.get("core_check")
    if ck:
        out.append(f"Core check at N = {ck['size']:,} ({ck['n_train']:,} molecules, {ck['epochs']} epoch(s), no "
                   f"dropout): pure-Python core {ck['core_test_bits_per_token']:.6f}, bridge "
                   f"{ck['bridge_test_bits_per_token']:.6f} bits/token: "
                   f"{'agree' if ck['agree'] else 'DISAGREE'} to 1e-6 — the core and the bridge are one model.")
    return out


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
    return [f"Validity of free samples at τ = 1 ({kit.and_join([f'{x:,}' for x in n])} samples a model, 95 % "
            "Wilson intervals; uniqueness and novelty, with theirs, in the sampling table): " + "; ".join(parts)
            + "."]


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


def _cap_bound(capped):
    """Where a capped row is above the n-gram: that row measures the cap, not the model (no second crossing)."""
    above = [x for x in capped if x["gap_bits_per_token"] > 0]
    if not above:
        return ""
    return (" Where such a row is above the n-gram (" + kit.and_join([f"N = {x['size']:,} {x['width']}"
                                                                     for x in above])
            + "), its verdict shows what the cap allowed, not what the model can do: it is no evidence of a second "
            "crossing.")


def _better_sentence(c, r):
    """The crossover, when a size is 'better': which width, where, how sure (seeds), against §11.3's rule; the
    width validation prefers beside it where that is another width."""
    first, width = c["first_better_size"], c.get("first_better_width")
    row = next(x for x in r["rows"] if x["size"] == first and (x["width"] == width if width else
                                                                x.get("preferred_by_validation")))
    caveat = f" ({row['width']} width, {len(row['seeds'])} seeds)"
    if c["below_at_smallest"]:
        where = f"already at the smallest size run: the crossover lies at or below N = {first:,}"
    elif c["interpolated"]:
        lo, hi = (kit.fmt(x, ",.0f") for x in c["range"])
        where = (f"the seed-mean gap changes sign at N ≈ {c['interpolated']:,.0f} (log-N interpolation; seeds "
                 f"{lo} – {hi})")
    else:
        where = "the seed-mean gap has no sign change to interpolate"
    pref = next((x for x in r["rows"] if x["size"] == first and x.get("preferred_by_validation")), None)
    beside = (f" The width validation prefers there ({pref['width']}, {kit.seeds_word(len(pref['seeds']))}) is "
              f"{_verdict_words(pref)} (gap {pref['gap_bits_per_token']:+.3f} bits/token)."
              if pref is not None and pref is not row else "")
    rule = f"§11.3's rule of thumb says about {SECTION_11_RULE:,} samples" + (
        f"; no size below N = {first:,} was run, so this run cannot place the crossover lower"
        if c["below_at_smallest"] else "")
    return f"The Transformer is first better at N = {first:,}{caveat}; {where}. {rule}.{beside}"


def page(payload):
    r = payload["results"]
    miss = _missing(r, payload)
    mode = payload.get("mode")
    head = ([_mode_line(mode, miss), ""] if miss else []) + [_held(r), ""]
    comparison = head + _data_lines(r) + ["", "Test bits/token (primary metric) per size and model:", ""] + _table(r)
    extras = (["Free samples at τ = 1 (seed 0; MOSES's published rows theirs, on other sample counts and the full "
               "training set):", ""] + _sampling_table(r) + [""] + _sampling_notes(r)
              + ["", "Measured training speed (molecules/s, validation scoring included; one thread a job): "
                 + "; ".join(f"{s['width']} N = {s['size']:,} seed {s['seed']} dropout {s['rate']}: "
                             f"{s['molecules_per_s']:.0f} ({s['epochs_run']} epochs)" for s in r["speeds"]) + ".",
                 "", "n-gram peak memory (tracemalloc, the chosen model refitted and scoring; the fitting process's "
                 "peak resident memory, search and data included): " + "; ".join(
                     f"N = {int(n):,}: {g['peak_memory_mb']:.0f} MB; " + (
                         f"{g['process_maxrss_mb']:,.0f} MB" if g.get("process_maxrss_mb") is not None else
                         "– (the file predates that field)")
                     for n, g in sorted(r["ngram"].items(), key=lambda t: int(t[0]))) + "."])
    return kit.Page(comparison, reading(r), differences(r), extras, ["data_hunger_bits", "data_hunger_sampling"])


def _mode_line(mode, miss):
    """What this run leaves out: a default run points to --extended; the extended plan names its own cuts."""
    if mode == "extended":
        return (f"**This is the extended run, the plan cut to fit the machine (the results' plan); not in it: "
                f"{kit.and_join(miss)}.**")
    article = "an" if str(mode)[:1] in "aeiou" else "a"
    return (f"**This is {article} {mode}-mode run; not in it: {kit.and_join(miss)}.** The full study is "
            "`python demos/demo_data_hunger.py --extended`.")


def headline(r):
    c = _crossover(r)
    sizes = ", ".join(f"{n:,}" for n in c["sizes_run"])
    if c["first_better_size"]:
        w = c["first_better_width"]
        row = next(x for x in r["rows"] if x["size"] == c["first_better_size"] and (
            x["width"] == w if w else x.get("preferred_by_validation")))
        least = "the smallest size run; " if c["below_at_smallest"] else ""
        ours = (f"Transformer better from N = {c['first_better_size']:,} MOSES molecules ({least}{row['width']} "
                f"width, {kit.seeds_word(len(row['seeds']))}; sizes run: {sizes})")
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
    return ours, "§11.3: not below ~1,000 samples (not measured)"


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


def fig_bits(meta, r, out_dir):
    plt = kit.plt()
    fig, a = plt.subplots(figsize=(7.2, 4.6))
    ns = sorted(map(int, r["ngram"]))
    a.plot(ns, [r["ngram"][str(n)]["test_bits_per_token"] for n in ns], "ks-", label="n-gram (Kneser-Ney, tuned)")
    for k, width in enumerate(sorted({x["width"] for x in r["rows"]})):
        rows = [x for x in _rows(r) if x["width"] == width]
        xs = [x["size"] for x in rows]
        a.plot(xs, [x["test_bits_per_token"]["mean"] for x in rows], "o-", color=f"C{k}", label=f"Transformer {width}")
        a.fill_between(xs, [x["test_bits_per_token"]["min"] for x in rows],
                       [x["test_bits_per_token"]["max"] for x in rows], color=f"C{k}", alpha=0.2)
    a.axvline(SECTION_11_RULE, color="gray", ls=":", label="§11.3: about 1,000 samples")
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
    for k, model in enumerate(sorted({s["model"] for s in r["sampling"]})):
        rows = sorted((s for s in r["sampling"] if s["model"] == model), key=lambda s: s["size"])
        xs = [s["size"] for s in rows]
        axes[0].plot(xs, [s["validity"] for s in rows], "o-", color=f"C{k}", label=model)
        axes[1].plot(xs, [(s["fcd"] or {}).get("fcd") or float("nan") for s in rows], "o-", color=f"C{k}", label=model)
    axes[0].set(xscale="log", xlabel="N", ylabel="validity", title="Validity of free samples (τ = 1)")
    axes[1].set(xscale="log", yscale="log", xlabel="N", ylabel="FCD vs test", title="FCD against the test sample")
    for a in axes:
        kit.legend_below(a)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "data_hunger_sampling")


FIGURES = [fig_bits, fig_sampling]
