"""Experiment 4's report (demos/demo_smiles_lm.py, figures/results_smiles_lm.json): a SMILES language model on ESOL,
sampling, validity and the grammar + valence constraint.  Its reading (printed and stored by the demo as
``reading_text``), figures, page (docs/04-smiles-lm.md) and overview row; the interface is report_kit's.  The standard
library only at import (RDKit and matplotlib inside the figure functions), so the demo can import it."""
import evaluation
import report_kit as kit

SMILES_LM_TEST_BITS = 2.812        # the tutorial's test bits/token of experiment 4
SMILES_TARGET_VALIDITY = 0.95      # the target for constrained sampling at tau = 1.0
SMILES_KL_MARGIN = 0.05            # constrained KL score within this of the test split's (the project's target)
SMILES_MAX_LONG_SHARE = 0.02       # at most this share of constrained samples >= 90 tokens (the project's target)
SMILES_MAX_FORCED = 0.02           # at most this share of constrained samples ended by the token budget
SMILES_MAX_BIG_RING = 0.01         # at most this share of valid constrained samples with a ring above training's
CLOSED_GAP = 0.02       # the candidate's closed-on-<eos> share may exceed the headline's by this much (absolute)
REPLACING_UPDATES = ("--add-candidate",)  # the provenance line: a later --add-candidate replaces the earlier's rows


def valid_not_forced(x):
    """The headline validity of a sampling row: the share of its n samples that are valid AND whose ending the
    token budget did not force (a budget-forced sample never counts as valid in a headline).  A free row has no
    budget forcing (a sample without <eos> is already invalid): its validity.  0.0 when every sample was forced."""
    if x.get("forced_share") is None:
        return x["validity"]
    if x.get("validity_not_forced") is None:
        return 0.0
    v, n = x["validity_not_forced"] * (1.0 - x["forced_share"]), x.get("n")
    return round(v * n) / n if n else v         # a count over n: no float noise between the page's figures


def rate_cells(x):
    """A sampling row's sampled rates, each with its 95 % Wilson interval from the stored counts (the n of the
    rate in parentheses where it is not the row's n): (valid and not forced / n, unique valid / n, novel unique /
    unique valid, novel / valid)."""
    n, nv, nu = x["n"], x["n_valid"], x["n_unique_valid"]
    nov, ours = novelty_of_row(x), x.get("novelty_of_valid")
    return (kit.rate_ci(round(valid_not_forced(x) * n), n), kit.rate_ci(nu, n),
            "–" if nov is None else f"{kit.rate_ci(round(nov * nu), nu)}, n={nu}",
            "–" if ours is None else f"{kit.rate_ci(round(ours * nv), nv)}, n={nv}")


share_ci = kit.share_ci     # a stored share of n items with its Wilson interval


def rate_of(x, which="valid"):
    """One sampled rate of a row with its interval and n, for a sentence: '0.415 [0.349, 0.484], n 200'."""
    valid, unique, novel, _ = rate_cells(x)
    cell = {"valid": valid, "unique": unique, "novel": novel}[which]
    return cell if which == "novel" else f"{cell}, n {x['n']}"


FORCED_IN = "(forced included)"     # the label of a figure that counts budget-forced samples as valid


def forced_in(x):
    """True when a sampling row's stored counts include budget-forced samples (a constrained row with any)."""
    return bool(x.get("constrained") and x.get("forced_share"))


def n_valid_cell(x, n_valid=None):
    """A row's count of valid samples for a table: as stored for a row without budget-forced samples; else the
    stored count labelled FORCED_IN with the count valid and not forced beside it."""
    n_valid = x["shape"]["n_valid"] if n_valid is None else n_valid
    if not forced_in(x):
        return str(n_valid)
    return f"{n_valid} {FORCED_IN}; not forced {round(valid_not_forced(x) * x['n'])}"


def seed_rows(r):
    """Every seed's sampling rows keyed by (τ, top-k, constrained): seed 0 first, then --extended's."""
    return [{(s["temperature"], s["top_k"], s["constrained"]): s for s in x["sampling"]}
            for x in [r] + list(r.get("extended", {}).get("seeds", {}).values())]


def _other_seeds(r, x):
    """The same setting's rows of the seeds after seed 0 (--extended), in seed order."""
    return [by[k] for k in [(x["temperature"], x["top_k"], x["constrained"])] for by in seed_rows(r)[1:] if k in by]


def _smiles_lm_seed_stats(r):
    """(bits/token, free validity, constrained valid-not-forced) at τ = 1.0 per seed: seed 0, then --extended's."""
    fits = [x["fit"]["test"]["bits_per_token"] for x in [r] + list(r.get("extended", {}).get("seeds", {}).values())]
    return [(bits, by[(1.0, None, False)]["validity"], valid_not_forced(by[(1.0, None, True)]))
            for bits, by in zip(fits, seed_rows(r))]


def _seed_cell(r, x):
    """'mean ± sd (k seeds)' of a row's headline validity (``valid_not_forced``) over its seeds; '–' with one."""
    key = (x["temperature"], x["top_k"], x["constrained"])
    vals = [valid_not_forced(by[key]) for by in seed_rows(r) if key in by]
    if len(vals) < 2:
        return "–"
    m, sd = kit.mean_sd(vals)
    return f"{m:.3f} ± {sd:.3f} ({len(vals)}; {min(vals):.3f}–{max(vals):.3f})"


def _constraint_work_sentence(r):
    """What the constrained validity at τ = 1.0 rests on, per seed: the shares closed after the model chose <eos>
    in an unfinished molecule and forced by the budget, and of valid samples with a ring larger than training's."""
    rows = [by[(1.0, None, True)] for by in seed_rows(r) if (1.0, None, True) in by]
    if not rows or rows[0].get("closed_on_eos_share") is None:
        return ""
    def join(k, n=lambda x: x["n"]):
        return ", ".join(share_ci(k(x), n(x), pct=True) for x in rows)
    ring, sh = ((r.get("data") or {}).get("train_shape") or {}).get("max_ring"), lambda x: x.get("shape") or {}
    big = ("; of the valid samples, " + join(lambda x: sh(x).get("share_ring_larger_than"), lambda x: sh(x).get(
        "n_valid")) + f" have a ring larger than any in training ({ring} atoms; forced ones included)" if ring else "")
    seeds = [str(r.get("seed", 0))] + list(r.get("extended", {}).get("seeds", {}))
    cand, own = candidate_rows(r).get((1.0, None)), rows[0].get("own_eos_share") is not None
    before = (f" (seed 0 under the candidate constraint, on the same random streams: "
              f"{share_ci(cand['closed_on_eos_share'], cand['n'], True)}; the model's own <eos> ended "
              f"{share_ci(cand.get('own_eos_share'), cand['n'], True)})" if cand else "")
    return (f"That constrained validity is not the model's alone: at τ = 1.0 (all tokens; seed"
            f"{'s' if len(rows) > 1 else ''} {', '.join(seeds[:len(rows)])}) the constraint closed "
            f"{join(lambda x: x['closed_on_eos_share'])} of the samples after the model chose <eos> in an "
            f"unfinished molecule{before}, "
            + (f"the model's own <eos> ended {join(lambda x: x.get('own_eos_share'))} (neither closed nor forced), "
               if own else "") + "and the token budget forced the ending of "
            f"{join(lambda x: x['forced_share'])} (counted invalid in the headline validity){big}; 95 % Wilson "
            "intervals.")


def _smiles_lm_failures(r, con):
    """The sentences on what the constraint cannot see at τ = 1.0, all tokens, seed 0 (``con``, the headline's
    setting): its invalid samples that ended with <eos> and the commonest reason, the total over all
    constrained settings beside it when there are others; its dead ends."""
    text, here = "", con["failures_after_eos"]
    rows = [x for x in r["sampling"] if x["constrained"]]
    total = sum(sum(x["failures_after_eos"].values()) for x in rows)
    others = f"; {total} invalid after <eos> over all {len(rows)} constrained settings" if len(rows) > 1 else ""
    if here:
        top = max(here, key=here.get)
        text += (f" What the constraint cannot see still fails: at τ = 1.0 (all tokens, seed 0), "
                 f"{sum(here.values())} of the {con['n']} constrained samples "
                 f"({share_ci(sum(here.values()) / con['n'], con['n'], pct=True)}) ended with <eos> yet are "
                 f"invalid, {here[top]} of them by {top.replace('_', ' ')} (as the project's classifier reads RDKit's "
                 f"problems{others}).")
    elif total:
        text += (f" What the constraint cannot see still fails: {total} constrained samples that ended with <eos> "
                 f"are invalid over all {len(rows)} constrained settings, none at τ = 1.0 (all tokens, seed 0).")
    stuck = con.get("stop_reason_counts", con["stop_reasons"]).get("no_allowed_token", 0)
    if stuck:
        text += (f" At τ = 1.0 (seed 0), {stuck} of {con['n']} constrained samples "
                 f"({share_ci(stuck / con['n'], con['n'], pct=True)}) stopped at a dead end that backtracking "
                 "could not undo, and count as invalid.")
    return text


def novelty_of_row(x):
    """A sampling row's novelty as the tutorial defines it (novel unique / unique valid): ``novelty``
    in results that also hold ``novelty_of_valid``, ``novelty_unique`` in the older ones."""
    return x["novelty"] if "novelty_of_valid" in x else x.get("novelty_unique")


def at_tutorial_n(x, key):
    """A sampling row's validity, uniqueness or novelty (the tutorial's definitions) at the tutorial's 200
    samples per setting: the mean over blocks of 200 when the row has more (``at_tutorial_n``; uniqueness
    falls and novelty rises with n), else the row's own value."""
    b = x.get("at_tutorial_n")
    if b:
        return b[key]["mean"]       # None: no block had a valid sample (never the row's own n instead)
    return novelty_of_row(x) if key == "novelty" else x[key]


def _ngram_sentence(r):
    """Does the Transformer beat the n-gram on test bits/token: a gap beyond the seed spread (when
    --extended ran seeds) and a paired bootstrap over the test molecules whose interval excludes 0."""
    ng = r.get("ngram")
    if not ng:
        return ""
    bits = [x[0] for x in _smiles_lm_seed_stats(r)]
    mean, sd = kit.mean_sd(bits)[0], evaluation.seed_spread(bits)          # the spread: max - min
    gap = mean - ng["fit"]["test"]["bits_per_token"]
    boot, which = ng.get("paired_bootstrap"), "seed 0"
    rung = next((x for x in (ladder_of(r) or {}).get("rungs", []) if x["rung"] == "tutorial"), None)
    if len(bits) > 1 and rung and len(rung["test_bits_per_token"]["seeds"]) == len(bits):
        boot, which = rung["paired_bootstrap"], f"pooled over the {len(bits)} seeds, as the seed mean"
    kind = "modified Kneser-Ney, discount scale" if ng.get("variant") == "modified" else "Kneser-Ney, discount"
    inside = ng.get("interior")
    where = ("" if inside is None else ", both interior to the grid" if all(inside.values()) else
             ", at the edge of the grid: " + " and ".join(k.split("_")[0] for k, v in inside.items() if not v))
    text = (f" The {ng['n']}-gram ({kind} {ng['discount']}, chosen on valid{where}) scores "
            f"{ng['fit']['test']['bits_per_token']:.3f} test bits/token, the Transformer {mean:.3f} "
            f"({abs(gap):.3f} {'lower' if gap < 0 else 'higher'}")
    text += f"; seed spread (max − min) {sd:.3f})" if len(bits) > 1 else "; one seed, no spread)"
    if boot:
        text += (f"; paired bootstrap over {boot['n_items']} test molecules ({which}), Transformer − n-gram "
                 f"bits/molecule {boot['diff']:+.2f} [{boot['ci_low']:+.2f}, {boot['ci_high']:+.2f}]")
    below = boot is not None and boot["ci_high"] < 0
    above = boot is not None and boot["ci_low"] > 0
    if len(bits) == 1:          # no spread: the seed half of the rule is vacuous, so no 'beats' (report_kit)
        verdict = (f"the Transformer is {'below' if below else 'above'} the n-gram by the paired interval alone "
                   f"({kit.ONE_SEED_NOTE})" if below or above else "neither is below the other (paired interval)")
    else:
        verdict = ("the Transformer beats the n-gram" if below and -gap > sd else "the n-gram beats the Transformer"
                   if above and gap > sd else "neither beats the other beyond the spread and the paired interval")
    if r.get("ladder"):
        verdict += (" with the tutorial's recipe (the ladder below adds the tutorial's dropout advice and remedies "
                    "beyond the tutorial)")
    return text + f": {verdict}."


LADDER_LABELS = {"tutorial": "tutorial recipe (as run here; see Differences)", "per_token": "+ per-token loss",
                 "early_stopping": "+ early stopping", "dropout": "+ dropout", "augmentation": "+ randomized SMILES"}


def ladder_of(r):
    """The recipe ladder of an --extended run (None in results without it)."""
    return r.get("ladder")


def _rung_label(lad, row):
    rate = f" {lad['dropout_rate']}" if row["recipe"]["dropout"] else ""
    return LADDER_LABELS[row["rung"]] + (rate if row["rung"] == "dropout" else "")


def _ladder_sentence(r):
    """Which rung of the recipe ladder first beats the tuned n-gram by the rule (the pooled paired interval
    below 0 and the gap in bits/token beyond the seed spread), from the stored verdicts; and the best rung's
    τ = 1.0 samples beside the tutorial recipe's."""
    lad = ladder_of(r)
    if not lad:
        return ""
    rows = lad["rungs"]
    steps = "; ".join(f"{_rung_label(lad, x)} {x['test_bits_per_token']['mean']:.3f} "
                      f"({x['test_bits_per_token']['min']:.3f}-{x['test_bits_per_token']['max']:.3f}): "
                      f"{x['verdict']}" for x in rows)
    first = lad.get("first_better")
    head = (f"The recipe ladder ({len(lad['seeds'])} seeds a rung, the tutorial's size, test bits/token against the "
            f"n-gram's {r['ngram']['fit']['test']['bits_per_token']:.3f}): {steps}. ")
    verdict = (f"The first rung that beats the n-gram (pooled paired interval below 0 and a gap beyond the seed "
               f"spread) is {_rung_label(lad, next(x for x in rows if x['rung'] == first))}: the tutorial's "
               "'n-gram statistics machine' describes its recipe, not the model." if first else
               ("No rung beats the n-gram by the rule (" + rows[0]["rule"] + "): the n-gram beats every rung."
                if all(x["verdict"] == "worse" for x in rows) else
                "No rung beats the n-gram by the rule (" + rows[0]["rule"] + "): at this size and data the n-gram "
                "stays level or better."))
    return head + verdict + _ladder_samples_sentence(r, lad)


def _ladder_samples_sentence(r, lad):
    bs = lad.get("best_sampling")
    if not bs:
        return ""
    mine = {x["constrained"]: x for x in bs["sampling"]}
    tut = {x["constrained"]: x for x in r["sampling"] if x["temperature"] == 1.0 and not x["top_k"]}
    return (f" Its best rung ({LADDER_LABELS[bs['rung']]}, seed 0, epoch {bs['epoch']}) at τ = 1.0: validity "
            f"{rate_of(mine[False])} free, {rate_of(mine[True])} constrained and not forced "
            f"(tutorial recipe {rate_of(tut[False])}, {rate_of(tut[True])}); uniqueness per 200 "
            f"{_block_cell(mine[False], 'uniqueness')} ({_block_cell(tut[False], 'uniqueness')})"
            f"{_block_label(mine[False])}.")


def _lm_shape_lines(r):
    """Every τ = 1.0 setting's valid samples beside the training molecules (seed 0), and validity by length."""
    ts = r["data"].get("train_shape")
    rows = [x for x in r["sampling"] if x["temperature"] == 1.0 and x.get("shape")]
    if not ts or not rows:
        return []
    out = [f"Shape of the valid samples at τ = 1.0 (seed 0) against the training molecules (mean heavy atoms "
           f"{ts['mean_heavy_atoms']:.1f}, largest ring {ts['max_ring']} atoms); KS = two-sample Kolmogorov–Smirnov "
           "statistic against training (0: same distribution). The shape columns describe every valid sample, "
           "budget-forced ones included (the results keep no shape of the others alone).", "",
           "| decoding | top-k | n valid | mean heavy atoms | KS heavy atoms | KS ring count | valid with a ring > "
           f"{ts['max_ring']} | ended by the budget | valid among the rest |", "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        sh = x["shape"]
        out.append(f"| {'constrained' if x['constrained'] else 'free'} | {x['top_k'] or 'all'} | {n_valid_cell(x)} | "
                   f"{kit.fmt(sh['mean_heavy_atoms'], '.1f')} | {kit.fmt(sh['ks_heavy_atoms'])} | "
                   f"{kit.fmt(sh['ks_rings'])} | {share_ci(sh['share_ring_larger_than'], sh.get('n_valid'), True)} | "
                   f"{share_ci(x.get('forced_share'), x['n'], True)} | {_rest_cell(x)} |")
    bins = [b["bin"] for b in rows[0]["validity_by_length"]]
    out += ["", "Validity by sample length (atom tokens), τ = 1.0, seed 0: valid / n in each bin (the results keep no "
            f"per-bin count of forced samples: a constrained row that had any counts them as valid, {FORCED_IN}).",
            "", "| decoding | top-k | " + " | ".join(bins) + " |", "|---|---|" + "---|" * len(bins)]
    for x in rows:
        out.append(f"| {'constrained' + (' ' + FORCED_IN if forced_in(x) else '') if x['constrained'] else 'free'} | "
                   f"{x['top_k'] or 'all'} | "
                   + " | ".join(f"{kit.rate_ci(b['valid'], b['n'])} (n {b['n']})" for b in x["validity_by_length"])
                   + " |")
    return out


def _rest_cell(x):
    """Valid among the samples the budget did not end, with its Wilson interval and n; '–' for a free row."""
    if x.get("validity_not_forced") is None:
        return "–"
    rest = x["n"] - round(x["forced_share"] * x["n"])
    return f"{kit.rate_ci(round(x['validity_not_forced'] * rest), rest)} (n {rest})"


def _lm_probe_lines(r):
    """The constraint's parts one at a time (--extended): τ = 1.0, all tokens, seed 0's model."""
    rows = r.get("constraint_probe")
    if not rows:
        return []
    mr = r["data"]["train_shape"]["max_ring"]
    out = ["The constraint's parts, one at a time (τ = 1.0, all tokens, seed 0's model; each row adds one change to "
           "the one above it, except the first, the constraint of earlier runs; each row from the code of the call "
           "that sampled it, Provenance: the --extended run or --add-probe, which may predate the candidate's "
           "rules, Differences).", "",
           "*valid and not forced / n* counts no sample whose ending the token budget forced; the shape columns "
           "describe every valid sample, forced ones included.", "",
           "| constraint | budget | n | valid and not forced / n | ended by the budget | dead ends | valid with a "
           f"ring > {mr} {FORCED_IN} | mean heavy atoms {FORCED_IN} | KS heavy atoms {FORCED_IN} |",
           "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        out.append(f"| {x['label']} | {x['budget']} | {x['n']} | {rate_cells(x)[0]} | "
                   f"{share_ci(x['forced_share'], x['n'], True)} | "
                   f"{share_ci(x['stop_reason_counts'].get('no_allowed_token', 0) / x['n'], x['n'], True)} | "
                   f"{share_ci(x['shape']['share_ring_larger_than'], x['shape'].get('n_valid'), True)} | "
                   f"{kit.fmt(x['shape']['mean_heavy_atoms'], '.1f')} | {kit.fmt(x['shape']['ks_heavy_atoms'])} |")
    return out


def _rows_wall(rows):                              # the stage times a list of rows records
    return sum(x.get("wall_time_s") or 0.0 for x in rows or [])


def _ladder_minutes(lad):
    """The ladder's recorded time in seconds: every run's training (rate search included) and its best rung's
    sampling and distribution rows (``lad['wall_time_s']`` is the last call's alone when the run resumed)."""
    best = lad.get("best_sampling") or {}
    return (sum(x.get("train_wall_time_s") or 0.0 for x in lad["runs"] + lad.get("other_rates", []))
            + (best.get("sampling_wall_time_s") or 0.0) + _rows_wall((best.get("distribution") or {}).get("rows")))


def recorded_wall_s(r):
    """The sum of the stage times the results record, in seconds (the overview's time of a resumed run): seed 0's
    training, sampling and distribution rows, the n-gram's sampling, SELFIES, the extra seeds, the ladder, the
    probe, the candidate; a lower bound (the n-gram's fit, the checks and the speed test keep no time)."""
    def run(x):
        return ((x.get("history") or {}).get("wall_time_s") or 0.0) + (x.get("sampling_wall_time_s") or 0.0) \
            + _rows_wall((x.get("distribution") or {}).get("rows"))
    ext = r.get("extended") or {}
    total = (r["model"].get("train_wall_time_s") or 0.0) + (r["speed"].get("sampling_wall_time_s") or 0.0)
    total += ((r.get("ngram") or {}).get("sampling_wall_time_s") or 0.0) \
        + _rows_wall((r.get("distribution") or {}).get("rows"))
    total += sum(run(x) for x in [ext.get("selfies") or {}] + list((ext.get("seeds") or {}).values()))
    c = r.get("constraint_candidate") or {}
    return total + (_ladder_minutes(r["ladder"]) if r.get("ladder") else 0.0) + _rows_wall(
        r.get("constraint_probe")) + _rows_wall([c]) + _rows_wall(_dist_rows(c))


def _epochs_cell(lad, x):
    """A rung's kept epoch per seed, '40 (cap)' where early stopping did not end the run (it reached the cap)."""
    cap = {y["seed"] for y in lad["runs"] if y["rung"] == x["rung"] and x["recipe"].get("early_stopping", True)
           and y["chosen"].get("stopped_at") == lad["max_epochs"]}
    return ", ".join(f"{e}" + (" (cap)" if s in cap else "") for s, e in zip(lad["seeds"], x["epochs_chosen"]))


def _rate_margin(lad):
    """' (validation 2.204 bits/token against 2.209: level with 0.05, ...)': the chosen rate against the next best
    on validation, level when the gap is within the chosen rate's seed spread (max - min), else ahead."""
    best, nxt = (sorted(lad.get("rate_table") or [], key=lambda t: t["valid_bits_per_token"]) + [None, None])[:2]
    if nxt is None or len(best["seeds"]) < 2:
        return ""
    gap, spread = nxt["valid_bits_per_token"] - best["valid_bits_per_token"], max(best["seeds"]) - min(best["seeds"])
    return (f" (validation {best['valid_bits_per_token']:.3f} bits/token against {nxt['valid_bits_per_token']:.3f}: "
            f"{'level with' if gap <= spread else 'ahead of'} {nxt['rate']}, the gap {gap:.3f} against the chosen "
            f"rate's seed spread {spread:.3f})")


def _lm_ladder_lines(r):
    """The ladder table: one row per rung, its seeds, and the paired test against the n-gram."""
    lad = ladder_of(r)
    if not lad:
        return ["*The recipe ladder is not in this results file: `python demos/demo_smiles_lm.py --extended` "
                "adds it.*"]
    ng = r["ngram"]["fit"]["test"]["bits_per_token"]
    out = [f"Recipe ladder ({lad['engine']}; up to {lad['max_epochs']} epochs with patience {lad['patience']} where "
           f"early stopping applies; dropout rate {lad['dropout_rate']} chosen on validation from "
           f"{lad['dropout_rates']}{_rate_margin(lad)}; {_ladder_minutes(lad) / 60:.1f} min: the runs' own training "
           f"times summed (parallel runs overlap) plus the sampling's and scoring's wall time). "
           f"Each rung against the tuned n-gram "
           f"({ng:.3f} test bits/token); the interval pools the {len(lad['seeds'])} seeds, resampling molecules; "
           "*(cap)*: the run reached the epoch cap.", "",
           "| rung | test bits/token, mean (min–max) | epochs kept | rung − n-gram, bits/molecule [95 % CI] | "
           "per-seed intervals | verdict |", "|---|---|---|---|---|---|"]
    for x in lad["rungs"]:
        b, t = x["paired_bootstrap"], x["test_bits_per_token"]
        seeds = "; ".join(f"[{p['ci_low']:+.2f}, {p['ci_high']:+.2f}]" for p in x["per_seed"].values())
        out.append(f"| {_rung_label(lad, x)} | {t['mean']:.3f} ({t['min']:.3f}–{t['max']:.3f}) | "
                   f"{_epochs_cell(lad, x)} | {b['diff']:+.2f} [{b['ci_low']:+.2f}, "
                   f"{b['ci_high']:+.2f}] | {seeds} | {x['verdict']} |")
    chk = lad.get("tutorial_rung_check")
    if chk:
        out += ["", f"Engine check: the tutorial rung at seed 0 (torch) scores {chk['torch']:.6f} test bits/token, the "
                    f"core's own run {chk['core']:.6f} (difference {chk['abs_diff']:.1e})."]
    return out + ["", "From how many molecules on does it beat the n-gram: [experiment 10](13-data-hunger.md)."]


def kl_like_for_like(x):
    """A row's KL score at the test split's size (``kl_at_size``, the like-for-like one: the score rises
    with the sample size) where the results have it, else its KL score on the whole set."""
    return x["kl_at_size"]["mean"] if "kl_at_size" in x else x["kl"]["score"]


def _distribution_sentence(r):
    """The constraint's targets at τ = 1.0 from the distribution table: KL score of constrained >=
    free's and not more than SMILES_KL_MARGIN below the test split's (real held-out molecules are the bar;
    the scores compared at the test split's size where the results have it), share >= 90 tokens <=
    SMILES_MAX_LONG_SHARE.  A constrained score above the test split's by more than the margin is said."""
    d = r.get("distribution") or {}
    if not d.get("available"):
        return f" Distribution metrics not computed ({d.get('reason', 'absent')})." if d else ""
    by = {(x["source"], x.get("temperature"), x.get("top_k"), x.get("constrained")): x for x in d["rows"]}
    free, con = by.get(("Transformer", 1.0, None, False)), by.get(("Transformer", 1.0, None, True))
    test = next((x for x in d["rows"] if x["source"] == "test split"), None)
    if not (free and con and test) or None in map(kl_like_for_like, (free, con, test)):
        return " The KL scores could not all be computed (see the table)."
    kf, kc, kt = map(kl_like_for_like, (free, con, test))
    ok_kl = kc >= kf and kc >= kt - SMILES_KL_MARGIN
    ok_long = con["share_long"] is not None and con["share_long"] <= SMILES_MAX_LONG_SHARE
    size = f" (each at the test split's {test['kl_at_size']['size']} molecules)" if "kl_at_size" in test else ""
    above = _above_test_split(con, kc, kt)
    text = (f" Against the training split at τ = 1.0, GuacaMol KL score{size} free {kf:.3f}, constrained {kc:.3f}, "
            f"test split {kt:.3f}{above}; FCD score free {kit.fmt(free['fcd']['score'])}, "
            f"constrained {kit.fmt(con['fcd']['score'])}, "
            f"test split {kit.fmt(test['fcd']['score'])} (over its {test['fcd'].get('n', test['n'])} molecules, the "
            f"constrained samples' over {con['fcd'].get('n', con['n_valid'])}: FCD is biased upward on fewer "
            "molecules, "
            f"so the test split's is no like-for-like bar); constrained samples ≥ {con['long_tokens']} tokens: "
            f"{share_ci(con['share_long'], con['n_valid'], True)} of the {con['n_valid']} valid.")
    if constraint_targets(r):
        return text                                        # the targets are judged together in _shape_sentence
    return (text[:-1] + f". The constraint {'meets' if ok_kl and ok_long else 'misses'} the target "
            f"(KL ≥ free's and at most {SMILES_KL_MARGIN} below the test split's: {'yes' if ok_kl else 'no'}; "
            f"≤ {SMILES_MAX_LONG_SHARE:.0%} long: {'yes' if ok_long else 'no'}).")


def _above_test_split(con, kc, kt):
    """Whether the constrained samples' KL score stands above the test split's: said only when every subset
    score (``kl_at_size``) clears the test split's by more than SMILES_KL_MARGIN; a mean above it by the
    margin with a subset that does not is said to be no ordering.  The test split's own score is one set of
    its molecules, its noise unmeasured, which the sentence says."""
    scores = (con.get("kl_at_size") or {}).get("scores") or [kc]
    if kc <= kt + SMILES_KL_MARGIN:
        return ""
    if min(scores) > kt + SMILES_KL_MARGIN:
        return (f"; the constrained samples score {kc - kt:.3f} above the test split, every one of their "
                f"{len(scores)} subsets by more than {SMILES_KL_MARGIN} (the test split is one set, its own noise "
                "unmeasured): nearer the training distribution by this score than these held-out molecules")
    return (f"; the constrained samples' mean score is {kc - kt:.3f} above the test split's, but their lowest of "
            f"{len(scores)} subsets is {min(scores) - kt:+.3f} from it (margin {SMILES_KL_MARGIN}): no ordering "
            "of the two is claimed")


def _tau1(r, constrained, top_k=None):
    return next(x for x in r["sampling"] if x["temperature"] == 1.0 and x["top_k"] == top_k
                and x["constrained"] == constrained)


def constraint_targets(r, candidate=False):
    """The τ = 1.0 constrained setting (seed 0; ``candidate``: the candidate's, whose KS statistics must also be
    below the headline's) against its targets: validity, the share ended by the budget, rings above the training
    maximum, heavy-atom KS ≤ free's, KL score (test split's size) ≥ free's and within the margin of the test
    split's, the long-sample share.  {name: (value, bound text, met)}; {} without shapes or candidate rows."""
    free, head, ts = _tau1(r, False), _tau1(r, True), (r.get("data") or {}).get("train_shape")
    con = candidate_rows(r).get((1.0, None)) if candidate else head
    if not con or not (con.get("shape") and free.get("shape")) or "forced_share" not in con or "data" not in r:
        return {}
    ks_c, ks_f, ks_h = con["shape"]["ks_heavy_atoms"], free["shape"]["ks_heavy_atoms"], head["shape"]["ks_heavy_atoms"]
    v = valid_not_forced(con)
    out = {"validity (not forced)": (v, f"≥ {SMILES_TARGET_VALIDITY}", v >= SMILES_TARGET_VALIDITY),
           "forced by the budget": (con["forced_share"], f"≤ {SMILES_MAX_FORCED:.0%}",
                                    con["forced_share"] <= SMILES_MAX_FORCED),
           f"valid with a ring above {r['data']['train_shape']['max_ring']} atoms": (
               con["shape"]["share_ring_larger_than"], f"≤ {SMILES_MAX_BIG_RING:.0%}" + candidate * " (max_ring_size)",
               (big := con["shape"]["share_ring_larger_than"]) is not None and big <= SMILES_MAX_BIG_RING),
           "heavy-atom KS against training": (
               ks_c, f"≤ free's {kit.fmt(ks_f)}" + (f", < the headline's {kit.fmt(ks_h)}" if candidate else "")
               + _paired(r, con, "ks_heavy_atoms")[0], None not in (ks_c, ks_f, ks_h) and ks_c <= ks_f
               and (not candidate or _paired(r, con, "ks_heavy_atoms")[1] is not False and ks_c < ks_h))}
    if candidate:
        ks_r, ks_rh, cl = con["shape"]["ks_rings"], head["shape"]["ks_rings"], head["closed_on_eos_share"]
        hists = [(w, y["ring_count_hist"]) for w, y in (("candidate", con["shape"]), ("headline", head["shape"]),
                                                          ("training", ts))]
        ringless = "without a ring: " + ", ".join(f"{w} {100 * h.get('0', 0) / sum(h.values()):.1f}%" for w, h in hists)
        below = _paired(r, con, "ks_rings")
        out["ring-count KS against training"] = (ks_r, f"< the headline's {kit.fmt(ks_rh)}{below[0]}; {ringless}",
                                                 None not in (ks_r, ks_rh) and ks_r < ks_rh and below[1] is not False)
        out["closed at the model's <eos>"] = (con["closed_on_eos_share"], f"≤ the headline's {cl:.3f} + {CLOSED_GAP}",
                                              con["closed_on_eos_share"] <= cl + CLOSED_GAP)   # not moved there
    d = (r["constraint_candidate"].get("distribution") if candidate else r.get("distribution")) or {}
    if candidate and not (d.get("available") and _dist_rows(r)):     # a target not computed is not met
        out["KL score"] = out["≥ 90 tokens"] = (None, "not computed", False)
    elif d.get("available"):
        by = {(x.get("temperature"), x.get("top_k"), x.get("constrained")): x for x in _dist_rows(r) + (
            d["rows"] if candidate else []) if x["source"] in ("Transformer", "Transformer, candidate constraint")}
        kf, kc = kl_like_for_like(by[(1.0, None, False)]), kl_like_for_like(by[(1.0, None, True)])
        kt = kl_like_for_like(next(x for x in _dist_rows(r) if x["source"] == "test split"))
        out["KL score"] = (kc, f"≥ free's {kit.fmt(kf)} and ≥ test split's {kit.fmt(kt)} − {SMILES_KL_MARGIN}",
                           None not in (kc, kf, kt) and kc >= kf and kc >= kt - SMILES_KL_MARGIN)
        long_share = by[(1.0, None, True)]["share_long"]
        out["≥ 90 tokens"] = (long_share, f"≤ {SMILES_MAX_LONG_SHARE:.0%}",
                              long_share is not None and long_share <= SMILES_MAX_LONG_SHARE)
    return out


def _paired(r, con, key):
    """('; paired by stream …: level (…)', below) of a candidate row's KS ``key`` (``kit.paired_word``); ('', None)."""
    p = (con.get("paired_shape") or {}).get(key)
    if not p:
        return "", None
    heads = [_tau1(r, True, con["top_k"])] + _other_seeds(r, _tau1(r, True, con["top_k"]))   # τ = 1.0 settings
    word = kit.paired_word(p, evaluation.seed_spread([x["shape"][key] for x in heads]))
    return (f"; paired by stream ({p['n_items']:,} streams, {p['n_resamples']:,} resamples; the seed spread: the "
            f"headline's over {len(heads)} trained models, n {', '.join(str(x['n']) for x in heads)}), candidate − "
            f"headline {p['diff']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]: {word}"), word == "below"


def _bins(x):
    return ", ".join(f"{b['bin']} tokens {kit.rate_ci(b['valid'], b['n'])} (n {b['n']})"
                     for b in x["validity_by_length"] if b["n"])


LENGTH_EFFECT = 2.0      # "validity is a length effect" when samples under 10 tokens are this many times as valid
                         # as those of 20 tokens or more


def _short_long_counts(x):
    """((valid, n) of samples under 10 tokens, (valid, n) of samples of 20 tokens or more) of a row."""
    bins = x["validity_by_length"]
    short = [b for b in bins if b["bin"] == "0-9"]
    long_ = [b for b in bins if int(b["bin"].split("-")[0].rstrip("+")) >= 20]
    return ((short[0]["valid"], short[0]["n"]) if short else (0, 0),
            (sum(b["valid"] for b in long_), sum(b["n"] for b in long_)))


def _short_long_validity(x):
    """(validity of samples under 10 tokens, of samples of 20 tokens or more) of a row; None where empty."""
    return tuple(k / n if n else None for k, n in _short_long_counts(x))


def _shape_sentence(r):
    """What the samples look like beside the training molecules at τ = 1.0 (seed 0): validity by token length
    (set beside the tutorial's validity, which counts short and long samples alike), heavy atoms, and the
    constraint's targets, each with its bound."""
    free, con = _tau1(r, False), _tau1(r, True)
    ts = (r.get("data") or {}).get("train_shape")
    if not ts or "validity_by_length" not in free:
        return ""
    short, long_ = _short_long_validity(free)
    if short is not None and long_ is not None and short >= LENGTH_EFFECT * max(long_, 1e-9):
        ref = SMILES_LM_REF["sampling"][(1.0, None)][0]
        word = kit.against_ours(ref, round(free["validity"] * free["n"]), free["n"], TUTORIAL_SAMPLES)
        effect = (f": the free validity, {rate_of(free)}, set beside the tutorial's {ref:.3f} ({word}), "
                  f"rests on short samples: those under 10 tokens are valid {short / max(long_, 1e-9):.1f}× as "
                  f"often as those from 20 on (threshold {LENGTH_EFFECT:g}×: a length effect; " + " ".join(
                      f"{kit.rate_ci(k, n)} (n {n}) {where}," for (k, n), where in zip(_short_long_counts(free), (
                          "under 10 tokens", "from 20 on")))[:-1] + "); whether length explains the gap to the "
                  "tutorial is not tested (its sample lengths are not reported)")
    else:
        effect = "; free validity does not fall with length by the stated factor"
    text = (f"By length at τ = 1.0 (seed 0), free validity is {_bins(free)}; constrained"
            f"{' ' + FORCED_IN if forced_in(con) else ''} {_bins(con)}. Valid free "
            f"samples have {kit.fmt(free['shape']['mean_heavy_atoms'], '.1f')} heavy atoms on average, constrained "
            f"{kit.fmt(con['shape']['mean_heavy_atoms'], '.1f')}, the training molecules "
            f"{ts['mean_heavy_atoms']:.1f} (KS against training {kit.fmt(free['shape']['ks_heavy_atoms'])} and "
            f"{kit.fmt(con['shape']['ks_heavy_atoms'])}){effect}.")
    for candidate in (False, True):
        targets = constraint_targets(r, candidate)
        x = candidate_rows(r).get((1.0, None)) if candidate else con
        if not targets:
            continue
        missed = [k for k, (_, _, ok) in targets.items() if not ok]
        kept = x["n"] - round(x["forced_share"] * x["n"])
        text += ((" The candidate constraint (+ rings up to the training maximum, + the lookahead) on the same "
                  "random streams (the samples part where the constraints first differ): "
                  if candidate else " Constrained at τ = 1.0: ")
                 + "; ".join(f"{k} {_target_cell(r, x, k, v, candidate)} ({bound}: {'yes' if ok else 'no'})"
                             for k, (v, bound, ok) in targets.items())
                 + "; valid among the samples the budget did not end "
                 + f"{kit.rate_ci(round(x['validity_not_forced'] * kept), kept)} (n {kept}). "
                 + ("Every target is met" if not missed else f"Missed: {', '.join(missed)}")
                 + ((": it may become the headline." if not missed else ": it stays the candidate.") if candidate
                    else "."))
    return text + _ending_sentence(r)


def _ending_sentence(r):
    """Where (not why) the candidate's τ = 1.0 heavy-atom gap lies (shape_by_ending): in the own-<eos> molecules if
    both groups are further from training (KS) than all valid ones, they below its mean, the closed ones not."""
    x, ts = candidate_rows(r).get((1.0, None)) or {}, r["data"].get("train_shape") or {}
    own, shut = (by := x.get("shape_by_ending") or {}).get("own <eos>"), by.get("closed at <eos>")
    if not (own and shut and own["n_valid"] and shut["n_valid"] and "mean_heavy_atoms" in ts):
        return ""
    mean, ks = ts["mean_heavy_atoms"], x["shape"]["ks_heavy_atoms"]
    return (" The candidate's valid τ = 1.0 molecules by how they ended: " + "; ".join(
        f"{e} {y['n_valid']}, {y['mean_heavy_atoms']:.1f} heavy atoms on average (KS {y['ks_heavy_atoms']:.3f})"
        for e, y in by.items() if y["n_valid"]) + f"; training {mean:.1f}. " + (
        "The heavy-atom gap lies in the molecules the model's own <eos> ended complete: smaller than training's and "
        f"further from it than the valid ones together (KS {ks:.3f}), while the ones closed at its <eos> are larger: "
        "the two err on opposite sides, and the KS of all of them is below either's. The split says where, not why: "
        "the ring limit and the lookahead shape both groups, and a long sample is more often unfinished when the "
        "model chooses <eos>." if min(own["ks_heavy_atoms"], shut["ks_heavy_atoms"]) >= ks and own[
            "mean_heavy_atoms"] < mean <= shut["mean_heavy_atoms"] else "The closings share the heavy-atom gap."))


def _target_cell(r, con, key, v, candidate=False):
    """A target's value for the reading: a sampled rate with its Wilson interval and n, else 0.xxx (KS, KL)."""
    if v is not None and key in ("validity (not forced)", "forced by the budget", "closed at the model's <eos>"):
        return f"{kit.rate_ci(round(v * con['n']), con['n'])}, n {con['n']}"
    if v is not None and key.startswith("≥ "):
        rows = r["constraint_candidate"]["distribution"]["rows"] if candidate else r["distribution"]["rows"]
        row = next(x for x in rows if x["source"].startswith("Transformer") and x.get("temperature") == 1.0
                   and x.get("top_k") is None and x.get("constrained"))
        return f"{kit.rate_ci(round(v * row['n_valid']), row['n_valid'])}, n {row['n_valid']} valid"
    if v is not None and key.startswith("valid with a ring") and "n_valid" in con["shape"]:
        nv = con["shape"]["n_valid"]
        return f"{kit.rate_ci(round(v * nv), nv)}, n {nv}"
    return kit.fmt(v, ".3f")


def candidate_rows(r):
    """{(τ, top-k): row} of the candidate constraint (--extended, --add-candidate); {} without them."""
    return {(x["temperature"], x["top_k"]): x for x in (r.get("constraint_candidate") or {}).get("rows", [])}


def _lm_candidate_lines(r):
    """The before -> after table: every constrained setting, headline -> candidate (seed 0, the same streams)."""
    cand, mr, c = candidate_rows(r), r["data"]["train_shape"]["max_ring"], r.get("constraint_candidate") or {}
    kl = [{(x.get("temperature"), x.get("top_k")): x for x in rows if x.get("constrained") and x["source"].startswith(
        "Transformer")} for rows in (_dist_rows(r), _dist_rows(c))]
    paired = "; ".join(f"τ = {k[0]}, top-k {k[1] or 'all'}: KS heavy{_paired(r, x, 'ks_heavy_atoms')[0][1:]}, "
                       f"KS rings{_paired(r, x, 'ks_rings')[0][1:]}" for k, x in cand.items() if x.get("paired_shape"))
    out = ["Before → after, every constrained setting (seed 0): the headline (closing at the model's <eos>) → the "
           "candidate (+ rings up to the training maximum, + the lookahead); sample i draws from one random stream "
           f"under both; {paired + ' (the other rows: untested)' if paired else 'no paired test'}. Ring, heavy-atom, "
           "KS: over the valid samples; a closing can also be forced; ended by the budget: the headline's, a step "
           "where the budget removed any token the grammar allows, the candidate's, a token its draw checked (the "
           f"narrower count); KL: mean ± sd over its repeats; * {FORCED_IN}: forced samples count too; intervals: "
           "the sampling and shape tables.", "", "| τ | top-k | n | valid, not forced "
           f"| ended by the budget | closed at <eos> | own <eos> | ring > {mr} * | heavy atoms * | KS heavy * | "
           "KS rings * | KL at the test size * |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, x in ((k, x) for x in r["sampling"] if (k := (x["temperature"], x["top_k"])) in cand and x["constrained"]):
        n = x["n"] if cand[key]["n"] == x["n"] else f"{x['n']} → {cand[key]['n']}"
        out.append(f"| {key[0]} | {key[1] or 'all'} | {n} | " + " | ".join(
            f"{a} → {b}" for a, b in zip(_cells(x, kl[0].get(key)), _cells(cand[key], kl[1].get(key)))) + " |")
    return out if cand else []


def _cells(y, d):
    """A constrained row's cells in the before -> after table (``d``: its distribution row, or None)."""
    sh, kl, ends = y["shape"], d and d.get("kl_at_size"), ("forced_share", "closed_on_eos_share", "own_eos_share")
    return [rate_cells(y)[0]] + [f"{100 * y[k]:.1f}%" if y.get(k) is not None else "–" for k
                                                           in ends] + [f"{100 * sh['share_ring_larger_than']:.1f}%",
        kit.fmt(sh["mean_heavy_atoms"], ".1f"), kit.fmt(sh["ks_heavy_atoms"]), kit.fmt(sh["ks_rings"])] + [
        f"{kl['mean']:.3f} ± {kl['sd']:.3f}" if kl else kit.fmt(d and kl_like_for_like(d))]


def _lift_sentence(r):
    """'; the lift per seed +0.396 [+0.385, +0.406], ...' of the τ = 1.0 validities in the reading's first
    sentence: each seed's constrained (valid, not forced) minus free validity with Newcombe's 95 % interval for a
    difference of two independent rates (evaluation.newcombe_interval)."""
    cells = []
    for by in seed_rows(r):
        free, con = by[(1.0, None, False)], by[(1.0, None, True)]
        kc, kf = round(valid_not_forced(con) * con["n"]), round(free["validity"] * free["n"])
        lo, hi = evaluation.newcombe_interval(kc, con["n"], kf, free["n"])
        cells.append(f"{kc / con['n'] - kf / free['n']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return (f"; the lift per seed {', '.join(cells)} (Newcombe's 95 % interval of a difference of two independent "
            "rates: free and constrained samples are separate draws, so there are no pairs to test)")


def _seed_label(r):
    """'mean ± std over 3 seeds; 10,000, 2,000, 2,000 samples; ' of the τ = 1.0 validities in the reading's first
    sentence: the seeds' spread labelled, with each seed's n; '' with one seed."""
    rows = [by[(1.0, None, False)] for by in seed_rows(r)]
    if len(rows) < 2:
        return ""
    ns = [x["n"] for x in rows]
    each = f"{ns[0]:,} samples each" if len(set(ns)) == 1 else ", ".join(f"{n:,}" for n in ns) + " samples"
    return f"mean ± std over {len(rows)} seeds; {each}; "


def _block_cell(x, key):
    """A row's uniqueness or novelty at the tutorial's n for a sentence: the mean ± std over its blocks of 200
    (labelled by ``_block_label``), or its own value with its Wilson interval where it has no blocks."""
    if not (b := x.get("at_tutorial_n")):
        return rate_cells(x)[{"uniqueness": 1, "novelty": 2}[key]]
    v = b[key]
    return "–" if v["mean"] is None else f"{v['mean']:.3f}" + (f" ± {v['sd']:.3f}" if v["sd"] is not None else "")


def _tutorial_vs_blocks(x, others=()):
    """'; the tutorial's uniqueness 0.305 lies outside the 3 seeds' ranges ([..]; ..) ...': the tutorial's one run
    of 200 samples against the range one block of 200 of ours falls in 95 % of the time (mean ± 1.96 sd of the
    blocks), for seed 0's row ``x`` and the other seeds' rows of its setting (``others``: one seed's range is
    its sampling noise, the seeds' add model-to-model variation); '' without blocks or the tutorial's figures."""
    b, ref = x.get("at_tutorial_n"), SMILES_LM_REF["sampling"].get((x["temperature"], x["top_k"]))
    if not b or not ref or x["constrained"]:
        return ""
    blocks = [y["at_tutorial_n"] for y in [x] + list(others) if y.get("at_tutorial_n")]
    cells = []
    for key, tut in (("uniqueness", ref[1]), ("novelty", ref[2])):
        if any(y[key]["mean"] is None or y[key]["sd"] is None for y in blocks):
            return ""
        ranges = [(y[key]["mean"] - 1.96 * y[key]["sd"], y[key]["mean"] + 1.96 * y[key]["sd"]) for y in blocks]
        k = sum(lo <= tut <= hi for lo, hi in ranges)
        shown = "; ".join(f"[{lo:.3f}, {hi:.3f}]" for lo, hi in ranges)
        word = "inside" if k == len(ranges) else "outside" if not k else f"inside {k} of"
        cells.append(f"the tutorial's {key} {tut:.3f} lies {word} "
                     + (f"the {len(ranges)} seeds' ranges ({shown}, seed 0 first)" if len(ranges) > 1 else shown))
    return (f"; against the range one block of {b['size']} of ours falls in 95 % of the time (mean ± 1.96 sd; "
            f"the tutorial's figures are one run of {b['size']}), {' and '.join(cells)}")


def _block_label(x):
    return f" (mean ± std over {b['blocks']} blocks)" if (b := x.get("at_tutorial_n")) else ""


def _per_block_label(x):
    b = x.get("at_tutorial_n")
    return (f", per {b['size']} samples as in the tutorial (mean over {b['blocks']} blocks of the {x['n']:,})"
            if b else "")


def reading(r):
    """Experiment 4's reading as bullets: test bits/token against the tutorial's (judged by the seed spread
    when --extended ran more seeds) and what the grammar + valence constraint does to validity at τ = 1.0;
    what the constraint cannot see; the n-gram baseline; the distribution metrics.  ``reading_text`` joins
    them into the paragraph the demo prints and stores."""
    by = {(x["temperature"], x["top_k"], x["constrained"]): x for x in r["sampling"]}
    free, con = by[(1.0, None, False)], by[(1.0, None, True)]
    stats = list(zip(*_smiles_lm_seed_stats(r)))
    n = len(stats[0])
    (bits, bits_sd), (v_free, v_free_sd), (v_con, v_con_sd) = (kit.mean_sd(list(x)) for x in stats)
    pm = (lambda m, sd: f"{m:.3f} ± {sd:.3f}") if n > 1 else (lambda m, sd: f"{m:.3f}")
    gap = bits - SMILES_LM_TEST_BITS
    rng = evaluation.seed_spread(list(stats[0]))                       # the seed spread: max - min
    spread = (f"beyond the seed spread (max − min) of {rng:.3f}" if abs(gap) > rng else
              f"within the seed spread (max − min) of {rng:.3f}") if n > 1 else "one seed: no spread to judge it"
    seeds = f" (mean ± std over {n} seeds)" if n > 1 else ""
    text = (f"test bits/token {pm(bits, bits_sd)}{seeds} is {abs(gap):.3f} "
            f"{'above' if gap > 0 else 'below'} the tutorial's {SMILES_LM_TEST_BITS} ({spread}; not a paired "
            f"comparison: the test molecules differ, {r['fit']['test'].get('n_molecules', '?')} here against the "
            f"tutorial's {SMILES_LM_REF['split'][2]}). At τ = 1.0 the "
            f"grammar + valence constraint lifts RDKit validity from {pm(v_free, v_free_sd)} to {pm(v_con, v_con_sd)} "
            f"({_seed_label(r)}constrained: valid and not ended by the token budget{_lift_sentence(r)}), ")
    text += ("meeting" if v_con >= SMILES_TARGET_VALIDITY else "short of") + \
        f" the project's {SMILES_TARGET_VALIDITY:.0%} target (the tutorial sets none); seed 0" + _per_block_label(free)
    if forced_in(con):          # a headline never counts a budget-forced sample as valid: free figures only
        text += (f": free uniqueness {_block_cell(free, 'uniqueness')}, novelty (the tutorial's: novel unique / "
                 f"unique valid) {_block_cell(free, 'novelty')}{_block_label(free)}"
                 f"{_tutorial_vs_blocks(free, _other_seeds(r, free))} (the "
                 "constrained per-200 figures would count budget-forced samples as valid: they are in the tables, "
                 "labelled).")
    else:
        text += (f": uniqueness {_block_cell(free, 'uniqueness')} → {_block_cell(con, 'uniqueness')}, novelty "
                 f"(the tutorial's: novel unique / unique valid) {_block_cell(free, 'novelty')} → "
                 f"{_block_cell(con, 'novelty')}{_block_label(free)}.")
    text += (" " + work) if (work := _constraint_work_sentence(r)) else ""
    parts = (_smiles_lm_failures(r, con), _ngram_sentence(r), _ladder_sentence(r), _distribution_sentence(r),
             _shape_sentence(r))
    return [text] + [x[1:] if x.startswith(" ") else x for x in parts if x]


def reading_text(r):
    """The reading as one paragraph (results["reading"] of the demo; the bullets joined by spaces)."""
    return " ".join(reading(r))


# sampling: (tau, top_k) -> (validity, uniqueness, novelty); the tutorial reports six of the eight settings.
TUTORIAL_SAMPLES = 200      # the tutorial's samples per sampling setting (its rates' n)
SMILES_LM_REF = {"split": (902, 112, 114), "params": 39360, "vocab": 28, "epochs": 6, "wall_min": 8,
    "fit": {"train": (2.012, 4.03, 0.566), "valid": (2.750, 6.73, 0.436), "test": (SMILES_LM_TEST_BITS, 7.02, 0.435)},
    "buckets": {"<=20": (2.896, 202), "21-32": (2.574, 1066), "33-48": (2.871, 1770), ">48": (3.011, 662)},
    "sampling": {(0.5, None): (0.720, 0.340, 0.529), (0.5, 5): (0.775, 0.310, 0.581),
                 (0.7, None): (0.545, 0.385, 0.468), (1.0, None): (0.325, 0.305, 0.623),
                 (1.3, None): (0.115, 0.105, 0.762), (1.3, 5): (0.270, 0.190, 0.579)}}
_LN2 = 0.6931471805599453         # nats -> bits
LM_SERIES = (("unrestricted", None, False, "#1f77b4", "o-"), ("top-k 5", 5, False, "#ff7f0e", "s-"),
             ("constrained", None, True, "#2ca02c", "o--"), ("constrained, top-k 5", 5, True, "#d62728", "s--"))


def _lm_rows(rows, top_k, constrained):
    return sorted((x for x in rows if x["top_k"] == top_k and x["constrained"] == constrained),
                  key=lambda x: x["temperature"])


def fig_smiles_lm_fit(meta, r, out_dir):
    """Learning curves and test bits/token per length bucket."""
    plt = kit.plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    h = r["history"]
    spe = max(1, h["n_steps"] / max(1, len(h["epochs"])))
    a.plot([s["step"] / spe for s in h["steps"]], [s["loss"] / _LN2 for s in h["steps"]], lw=0.7, alpha=0.6,
           label="train, per step")
    ep = h["epochs"]
    a.plot([e["epoch"] for e in ep], [e["train_loss"] / _LN2 for e in ep], "o-", label="train, epoch mean")
    a.plot([e["epoch"] for e in ep], [e["valid_loss"] / _LN2 for e in ep], "s-", label="valid")
    ref = SMILES_LM_REF
    kit.ref_mark(a, [len(ep)] * 2, [ref["fit"]["train"][0], ref["fit"]["valid"][0]],
                 label="tutorial, final train / valid")
    a.set(xlabel="epoch", ylabel="bits / token (mean per molecule)", title="Learning curves")
    a.legend(fontsize=7)
    bk = r["fit"]["test_buckets"]
    xs = range(len(bk))
    b.bar(xs, [x["bits_per_token"] or 0 for x in bk], color="#1f77b4", label="this run")
    kit.ref_mark(b, xs, [ref["buckets"].get(x["bucket"], (None,))[0] for x in bk])
    b.set_xticks(list(xs), [f"{x['bucket']} tokens\n({x['n_tokens']} scored)" for x in bk], fontsize=7)
    b.axhline(r["fit"]["test"]["bits_per_token"], color="gray", ls=":", label="test overall")
    b.set(ylabel="test bits / token", title="Test bits/token by molecule length")
    b.legend(fontsize=7)
    fig.suptitle("Experiment 4: SMILES LM on ESOL — " + kit.subtitle(meta), fontsize=9)
    return kit.save(fig, out_dir, "smiles_lm_fit", meta)


LM_DEFINITIONS = {"validity": "valid / n (no <eos>, forced: invalid)", "uniqueness": "unique valid / n",
                  "novelty": "novel unique / unique valid"}     # the tutorial's definitions


def _lm_value(x, key):
    """A sampling row's value by the tutorial's definitions at its 200 samples per setting (older results:
    novelty_unique; rows without ``at_tutorial_n``: their own n).  A constrained row's validity counts no
    budget-forced sample (``valid_not_forced``; over all its samples, which equals the mean over its blocks)."""
    v = valid_not_forced(x) if key == "validity" and x.get("forced_share") is not None else at_tutorial_n(x, key)
    return float("nan") if v is None else v


def _lm_sizes(r):
    return " / ".join(map(str, ns := sorted({x["n"] for x in r["sampling"]}))) + " (τ 1.0 settings)" * (len(ns) > 1)


def _selfies_rows(r):
    ext = r.get("extended", {}).get("selfies")
    return _lm_rows(ext["sampling"], None, False) if ext else []


def fig_smiles_lm_sampling(meta, r, out_dir):
    """Validity, uniqueness and novelty against temperature for every sampling family."""
    plt = kit.plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    keys = (("validity", 0), ("uniqueness", 1), ("novelty", 2))
    for a, (key, k) in zip(axes, keys):
        for label, top_k, con, color, style in LM_SERIES:
            rows = _lm_rows(r["sampling"], top_k, con)
            a.plot([x["temperature"] for x in rows], [_lm_value(x, key) for x in rows], style, color=color, label=label)
        sf = _selfies_rows(r)
        if sf:
            a.plot([x["temperature"] for x in sf], [_lm_value(x, key) for x in sf], "^-", color="#9467bd",
                   label="SELFIES")
        ref = SMILES_LM_REF["sampling"]
        for top_k, color in ((None, "k"), (5, "#8c564b")):
            pts = sorted((t, v[k]) for (t, kk), v in ref.items() if kk == top_k)
            kit.ref_mark(a, [p[0] for p in pts], [p[1] for p in pts], color=color,
                      label=f"tutorial{', top-k 5' if top_k else ''}")
        if key == "validity":
            a.axhline(SMILES_TARGET_VALIDITY, color="gray", ls=":", lw=0.8)
        forced = key != "validity" and any(forced_in(x) for x in r["sampling"])
        a.set(xlabel="temperature τ", ylabel=LM_DEFINITIONS[key], ylim=(-0.03, 1.05),
              title=key.capitalize() + ("\n(constrained: forced included)" if forced else ""))
    kit.legend_below(axes[1], ncol=4)
    per = next((x["at_tutorial_n"]["size"] for x in r["sampling"] if x.get("at_tutorial_n")), None)
    fig.suptitle(f"Sampling {_lm_sizes(r)} molecules per setting"          # two lines: clear of the stamp
                 + (f", scored per {per} as in the tutorial (block means)" if per else "")
                 + "; no <eos> = invalid\n" + kit.subtitle(meta), fontsize=9)
    fig.subplots_adjust(top=0.78)
    return kit.save(fig, out_dir, "smiles_lm_sampling", meta)


def fig_smiles_lm_failures(meta, r, out_dir):
    """Why the invalid samples fail, per setting (stacked counts)."""
    plt = kit.plt()
    rows = sorted(r["sampling"], key=lambda x: (x["constrained"], x["top_k"] or 0, x["temperature"]))
    reasons = list(rows[0]["failures"])
    fig, a = plt.subplots(figsize=(10, 3.6))
    bottom = [0] * len(rows)
    for reason in (x for x in reasons if x != "no_eos"):   # samples that ended with <eos>, by RDKit's reason
        vals = [x["failures_after_eos"].get(reason, 0) / x["n"] for x in rows]
        a.bar(range(len(rows)), vals, bottom=bottom, label=reason.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    cut = [(x["n"] - x["n_valid"] - sum(x["failures_after_eos"].values())) / x["n"] for x in rows]
    a.bar(range(len(rows)), cut, bottom=bottom, color="lightgray", hatch="//", edgecolor="gray",
          label="cut: length limit or nothing allowed (no <eos>)")
    labels = [f"τ {x['temperature']}{' k5' if x['top_k'] else ''}\n{'constr.' if x['constrained'] else 'free'}"
              for x in rows]
    a.set_xticks(range(len(rows)), labels, fontsize=6.5)
    a.set(ylabel=f"share of samples invalid (n = {_lm_sizes(r)})",
          title="Failure reasons (RDKit category; samples that ended with <eos>) and samples cut at the length limit")
    a.legend(fontsize=7, ncol=3)
    fig.suptitle("Experiment 4 — " + kit.subtitle(meta), fontsize=9)
    return kit.save(fig, out_dir, "smiles_lm_failures", meta)


def _grid_sets(r):
    """(file name, title, SMILES) of each grid: free valid and constrained Transformer samples at τ = 1.0
    (samples that ended with <eos>), the n-gram's free samples and the training split resampled."""
    def row(constrained):
        x = next(x for x in r["sampling"]
                 if x["constrained"] == constrained and x["temperature"] == 1.0 and not x["top_k"])
        why = x.get("stop_reasons") if isinstance(x.get("stop_reasons"), list) else ["eos"] * len(x["samples"])
        return [s for s, w in zip(x["samples"], why) if w == "eos"]
    out = [("smiles_lm_grid_free", "free samples (valid), τ = 1.0", row(False)),
           ("smiles_lm_grid", "constrained samples, τ = 1.0", row(True))]
    for x in (r.get("distribution") or {}).get("rows", []):
        if x["source"] == "n-gram" and x.get("temperature") == 1.0 and not x.get("top_k") and not x.get("constrained"):
            out.append(("smiles_lm_grid_ngram", "n-gram samples (valid), τ = 1.0", x["examples"]))
        if x["source"] == "training (resampled)":
            out.append(("smiles_lm_grid_train", "training molecules (resampled)", x["examples"]))
    return out


def fig_smiles_lm_grid(meta, r, out_dir):
    """RDKit grids of 12 molecules each: free valid, constrained, n-gram, training."""
    out = []
    for name, title, smiles in _grid_sets(r):
        mols = kit.grid_molecules(smiles)
        if mols:
            out += kit.molecule_grid(meta, mols, title, out_dir, name)
    return out


def _dist_rows(r):
    d = r.get("distribution") or {}
    return d.get("rows", []) if d.get("available") else []


def _dist_label(x):
    if x.get("reference"):
        return x["source"]
    return f"{x['source']} τ {x['temperature']}{' k5' if x['top_k'] else ''}{' constr.' if x['constrained'] else ''}"


DIST_METRICS = (("KL score at the test split's size", kl_like_for_like),
                ("FCD score exp(−0.2 FCD)", lambda x: x["fcd"]["score"]),
                ("IntDiv1", lambda x: x["int_div1"]), ("SNN to training", lambda x: x["snn"]),
                ("Frag cosine", lambda x: x["frag"]), ("Scaf cosine", lambda x: x["scaf"]))


def fig_smiles_lm_distribution(meta, r, out_dir):
    """The distribution-metric table as bars: every metric per row, the reference rows in gray."""
    rows = _dist_rows(r)
    if not rows:
        return []
    plt = kit.plt()
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), sharey=True)
    colors = ["#9e9e9e" if x.get("reference") else ("#1f77b4" if x["source"] == "Transformer" else "#ff7f0e")
              for x in rows]
    for a, (label, get) in zip(axes.flat, DIST_METRICS):
        vals = [get(x) for x in rows]
        a.barh(range(len(rows)), [v if v is not None else 0 for v in vals], color=colors)
        for i, v in enumerate(vals):
            a.text((v or 0) + 0.01, i, "–" if v is None else f"{v:.2f}", va="center", fontsize=6)
        a.set_yticks(range(len(rows)), [_dist_label(x) for x in rows], fontsize=6.5)
        a.set(xlim=(0, 1.15), title=label)
    axes[0][0].invert_yaxis()                                  # shared y: once puts the first row on top
    for a in axes[1]:
        a.set_xlabel("score (0–1; higher: closer to training, or more diverse for IntDiv1)", fontsize=7)
    fig.subplots_adjust(hspace=0.3, left=0.16, right=0.98)
    fig.suptitle("Distribution metrics against the training split (gray: reference rows) — " + kit.subtitle(meta),
                 fontsize=9)
    return kit.save(fig, out_dir, "smiles_lm_distribution", meta)


def fig_smiles_lm_lengths(meta, r, out_dir):
    """Token-length histograms of valid samples against the training split's."""
    rows = [x for x in _dist_rows(r) if not x.get("reference") and x.get("temperature") == 1.0 and not x.get("top_k")]
    if not rows:
        return []
    plt = kit.plt()
    d = r["distribution"]
    ncol = 2 if len(rows) > 1 else 1
    nrow = (len(rows) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.1 * nrow + 0.6), sharey=True, squeeze=False)
    for a in list(axes.flat)[len(rows):]:
        a.axis("off")
    axes = list(axes.flat)
    th = d["train_length_histogram"]
    mids = [(lo + hi) / 2 for lo, hi in zip(th["edges"], th["edges"][1:])]
    width = th["edges"][1] - th["edges"][0]
    tr = [c / max(1, sum(th["counts"])) for c in th["counts"]]
    for a, x in zip(axes, rows):
        h = x["length_histogram"]
        share = [c / max(1, sum(h["counts"])) for c in h["counts"]]
        a.bar(mids, share, width=width * 0.9, alpha=0.6, label=f"samples ({sum(h['counts'])} valid)")
        a.step(th["edges"][:-1] + [th["edges"][-1]], tr + [tr[-1]], where="post", color="k", label="training split")
        a.axvline(x["long_tokens"], color="gray", ls=":", lw=0.8)
        a.set(xlabel="atom tokens per molecule (last bin ≥ 95)", ylabel="share of molecules",
              title=_dist_label(x) + f": ≥ {x['long_tokens']} tokens {kit.fmt(x['share_long'], '.1%')}")
        a.title.set_fontsize(8)
        a.xaxis.label.set_fontsize(8)
        a.legend(fontsize=6.5)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.suptitle("Lengths of valid samples against the training split — " + kit.subtitle(meta), fontsize=9)
    return kit.save(fig, out_dir, "smiles_lm_lengths", meta)


def fig_smiles_lm_shapes(meta, r, out_dir):
    """Heavy atoms and ring counts of the valid τ = 1.0 samples (free, constrained) against the training molecules."""
    ts = r["data"].get("train_shape")
    rows = [x for x in r["sampling"] if x["temperature"] == 1.0 and not x["top_k"] and x.get("shape")]
    if not ts or not rows:
        return []
    plt = kit.plt()
    fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.4))
    for a, key, label in ((axes[0], "heavy_atoms_hist", "heavy atoms per molecule"),
                          (axes[1], "ring_count_hist", "rings per molecule (SSSR)")):
        series = [("training molecules", ts[key], "k")] + [
            (("constrained" if x["constrained"] else "free") + f" τ 1.0 ({x['shape']['n_valid']} valid)",
             x["shape"][key], "#d62728" if x["constrained"] else "#1f77b4") for x in rows]
        for name, hist, color in series:
            keys = sorted(int(k) for k in hist)
            total = max(1, sum(hist.values()))
            xs = list(range(0, max(keys) + 2)) if keys else [0]
            ys = [hist.get(str(k), hist.get(k, 0)) / total for k in xs]
            a.step(xs, ys, where="mid", color=color, label=name, lw=1.4 if color == "k" else 1.0)
        a.set(xlabel=label, ylabel="share of valid molecules")
        a.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.suptitle("Shape of valid samples against the training molecules — " + kit.subtitle(meta), fontsize=9)
    return kit.save(fig, out_dir, "smiles_lm_shapes", meta)


def _lm_fit_table(r):
    ref = SMILES_LM_REF["fit"]
    seeds = len(r.get("extended", {}).get("seeds", {})) + 1
    out = [f"Seed 0's model (the reading gives the mean over the {seeds} seeds):", ""] if seeds > 1 else []
    out += ["| split | molecules | scored tokens | bits/token | reference | perplexity | reference | token accuracy | "
           "reference | bits/char | bits/molecule |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in ("train", "valid", "test"):
        f = r["fit"][s]
        out.append(f"| {s} | {f['n_molecules']} | {f['n_tokens']:,} | {f['bits_per_token']:.3f} | {ref[s][0]:.3f} | "
                   f"{f['perplexity']:.2f} | {ref[s][1]:.2f} | {f['token_accuracy']:.3f} | {ref[s][2]:.3f} | "
                   f"{f['bits_per_char']:.3f} | {f['bits_per_molecule']:.1f} |")
    out += ["", "| test molecules of | molecules | scored tokens | bits/token | reference (tokens) |",
            "|---|---|---|---|---|"]
    for b in r["fit"]["test_buckets"]:
        rb = SMILES_LM_REF["buckets"].get(b["bucket"])
        out.append(f"| {b['bucket']} tokens | {b['n_molecules']} | {b['n_tokens']:,} | "
                   f"{kit.fmt(b['bits_per_token'])} | "
                   + (f"{rb[0]:.3f} ({rb[1]:,}) |" if rb else "– |"))
    return out


def _in_out(ref, x, others):
    """Each tutorial rate (valid, unique, novel: one run of 200, so ``ref_n`` 200, 200 and its unique valid
    count) against seed 0's 95 % Wilson interval, as ``kit.against_ours``: 'in' (inside ours), 'near' (outside,
    but its own interval overlaps ours) or 'apart'; then how many seeds' intervals hold it (rows ``x`` and
    ``others`` of one setting): [' (apart; 0 of 3 seeds)', ...]."""
    rows, marks = [[(round(valid_not_forced(y) * y["n"]), y["n"]), (y["n_unique_valid"], y["n"]),
                    (None if novelty_of_row(y) is None else round(novelty_of_row(y) * y["n_unique_valid"]),
                     y["n_unique_valid"])] for y in [x] + list(others)], []
    for i, v in enumerate(ref):                               # i: 0 valid, 1 unique, 2 novel
        (k, n), ref_n = rows[0][i], round(ref[1] * TUTORIAL_SAMPLES) if i == 2 else TUTORIAL_SAMPLES
        word = "" if k is None or not n else kit.against_ours(v, k, n, ref_n)
        word = word and ("in" if word.startswith("inside") else "near" if word.endswith(" overlaps ours") else "apart")
        held = sum(kit.inside_word(v, *c[i]) == "inside" for c in rows if c[i][0] is not None and c[i][1])
        marks.append("" if not word else f" ({word}; {held} of {len(rows)} seeds)" if len(rows) > 1 else f" ({word})")
    return marks


def _lm_ref_cell(x, n=TUTORIAL_SAMPLES):
    """The tutorial's valid / unique / novel for a free sampling row's (tau, top-k), else '–'.  Beside a row of
    another n than the tutorial's 200 only its validity stands (unique valid / n and novelty move with n): its
    uniqueness and novelty are pointed to the per-200 block table."""
    rv = None if x["constrained"] else SMILES_LM_REF["sampling"].get((x["temperature"], x["top_k"]))
    if not rv:
        return "–"
    if n != TUTORIAL_SAMPLES:
        return f"{rv[0]:.3f} / – / –"
    return " / ".join(f"{v:.3f}" for v in rv)


def _tutorial_marks(r):
    """The line under the sampling table: each free setting's tutorial rates against ours (``_in_out``)."""
    cells = []
    for x in sorted((x for x in r["sampling"] if not x["constrained"] and "n_unique_valid" in x),
                    key=lambda x: (x["temperature"], x["top_k"] or 0)):
        rv = SMILES_LM_REF["sampling"].get((x["temperature"], x["top_k"]))
        keep = 3 if x["n"] == TUTORIAL_SAMPLES else 1          # beyond 200 samples unique and novel move with n
        cells += [f"τ {x['temperature']}, top-k {x['top_k'] or 'all'}: " + " / ".join(
            f"{v:.3f}{m}" for v, m in zip(rv[:keep], _in_out(rv, x, _other_seeds(r, x))))] if rv else []
    return ["", "The tutorial's valid / unique / novel against ours (one run of 200 each: *in* seed 0's 95 % "
                "interval, *near* it (outside, but the tutorial's own interval overlaps it) or *apart*; then how many "
                "seeds' intervals hold it; beyond 200 samples the validity alone): "
                + "; ".join(cells) + "."] if cells else []


def _failure_cell(x):
    """A sampling row's invalid samples in disjoint counts that sum to n minus its valid-and-not-forced count:
    RDKit's reason for each invalid sample, 'no eos' for a free sample cut at the token cap, 'dead end' for a
    constrained one that stopped with no token allowed, and 'forced, else valid' for a sample RDKit accepts
    whose ending the token budget forced (never counted valid)."""
    dead = "dead end" if x["constrained"] else "no eos"
    parts = [f"{dead if k == 'no_eos' else k.replace('_', ' ')} {v}" for k, v in x["failures"].items() if v]
    forced_valid = x["n"] - round(valid_not_forced(x) * x["n"]) - sum(x["failures"].values())
    parts += [f"forced, else valid {forced_valid}"] if x.get("forced_share") and forced_valid > 0 else []
    return ", ".join(parts) or "none"


def _lm_sampling_table(r, cap):
    out = ["Each sampled rate carries its 95 % Wilson interval in brackets (from the stored counts); a rate whose "
           "denominator is not the row's n gives its n. "
           "Constrained rows: *valid / n* counts only samples whose ending the token budget did not force (a forced "
           "sample is never counted valid); the forced share and the share the constraint closed after an early "
           "<eos> stand beside it, each with its interval. Beside a row of more than the tutorial's 200 samples its "
           "reference gives only the validity (unique valid / n and novelty move with n: the per-200 table below "
           "compares them). The seeds column is the mean ± std of that validity over every seed that ran the "
           "setting (their count; min–max; seed 0 alone is the row): the tutorial's figure is one run, so the line "
           "below the table sets it beside every seed's interval as well as seed 0's. Uniqueness and "
           "novelty are stored over every valid sample, forced ones included, so where the budget forced any "
           "sample of a row its uniqueness and novelty cells show –. Failures are disjoint counts summing to n − "
           "valid: the reason the project's classifier (smiles_failure_reason) reads from RDKit for each invalid "
           "sample; "
           f"*no eos*, a free sample cut at the {cap}-token cap before <eos> (the tutorial states no cap); "
           "*dead end*, a constrained sample stopped with no token allowed that backtracking could not undo; "
           "*forced, else valid*, a sample RDKit accepts whose ending the budget forced.", "",
           "| τ | top-k | decoding | n | valid / n | valid / n over seeds | forced by the budget | closed at an early "
           "<eos> | unique valid / n | novel unique / unique valid | reference (valid / unique / novel) | "
           "novel / valid (ours) | failures (disjoint, summing to n − valid: see below) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    speed = []
    for x in sorted(r["sampling"], key=lambda x: (x["temperature"], x["top_k"] or 0, x["constrained"])):
        fails = _failure_cell(x)
        valid, uniq, nov, ours = rate_cells(x)
        if forced_in(x):
            uniq, nov, ours = "–", "–", "–"
        out.append(f"| {x['temperature']} | {x['top_k'] or 'all'} | {'constrained' if x['constrained'] else 'free'} | "
                   f"{x['n']} | {valid} | {_seed_cell(r, x)} | "
                   f"{share_ci(x.get('forced_share'), x['n'])} | "
                   f"{share_ci(x.get('closed_on_eos_share'), x['n'])} | {uniq} | {nov} | "
                   + _lm_ref_cell(x, x["n"]) + f" | {ours} | {fails} |")
        speed.append(f"τ {x['temperature']} {x['top_k'] or 'all'} {'constrained' if x['constrained'] else 'free'} "
                     f"{kit.fmt(x.get('tokens_per_s'), '.0f')}")
    out += ["", "Sampling speed per setting, tokens/s (seed 0; over the summed per-sample decode times, so one "
                "process's speed, measured in the call that ran the sampling stage, under that host's load: not a "
                "ranking of the settings): " + ", ".join(speed) + "."]
    return out + _tutorial_marks(r) + _cap_line(r) + _chain_line(r) + _lm_block_table(r)


def _cap_line(r):
    """Free samples cut at the token cap per seed, for the settings where any seed had any: a seed whose samples
    run on without <eos> where the others' stop says its row is that seed's, not the model recipe's."""
    rows = seed_rows(r)
    keys = sorted({k for by in rows for k, x in by.items() if not k[2] and x["failures"].get("no_eos")},
                  key=lambda k: (k[0], k[1] or 0))
    if len(rows) < 2 or not keys:
        return []
    cells = "; ".join(f"τ {k[0]}, top-k {k[1] or 'all'}: " + ", ".join(
        f"{by[k]['failures'].get('no_eos', 0)} of {by[k]['n']}" if k in by else "–" for by in rows) for k in keys)
    seeds = ", ".join(["0"] + list((r.get("extended") or {}).get("seeds", {})))
    mine = {k: rows[0][k]["failures"].get("no_eos", 0) for k in keys if k in rows[0]}
    own = [k for k, m in mine.items() if m >= CAP_ALONE_SHARE * rows[0][k]["n"] and
           max(by[k]["failures"].get("no_eos", 0) if k in by else m for by in rows[1:]) <= m / 4]
    note = ("" if not own else f" Where seed 0 alone runs to the cap (at least {CAP_ALONE_SHARE:.0%} of its samples, "
            "every other seed at most a quarter of its count: " + "; ".join(f"τ {k[0]}, top-k {k[1] or 'all'}"
                                                                          for k in own) +
            "), seed 0's samples run on where the other seeds' stop: there its row is one seed's behaviour, which the "
            "other seeds here do not share (the seed counts in the tutorial line above).")
    return ["", f"Free samples cut at the token cap without <eos>, per seed ({seeds}; seed 0 is the table's row): "
                f"{cells}.{note}"]


CAP_ALONE_SHARE = 0.1   # _cap_line: seed 0's row is its own where at least this share of its samples hit the cap
LONG_CHAIN = 30         # a run of this many aliphatic C in a sample: a degenerate chain, not a drug-like molecule


def _chain_line(r):
    """Constrained settings (seed 0, samples stored) whose samples hold a run of LONG_CHAIN or more 'C', with
    how many of those the budget forced: such chains count as valid unless forced."""
    run = "C" * LONG_CHAIN
    bits = []
    for x in sorted((x for x in r["sampling"] if x["constrained"] and x.get("samples")),
                    key=lambda x: (x["temperature"], x["top_k"] or 0)):
        hit = [i for i, smi in enumerate(x["samples"]) if run in smi]
        if hit:
            forced = sum(1 for i in hit if (x.get("forced") or [False] * x["n"])[i])
            bits.append(f"τ {x['temperature']}, top-k {x['top_k'] or 'all'}: {len(hit)} of {x['n']} ({forced} forced)")
    if not bits:
        return []
    return ["", f"Constrained samples (seed 0) holding a run of {LONG_CHAIN} or more aliphatic C, a degenerate chain: "
            + "; ".join(bits) + ". Those not forced count as valid in the columns above."]


def _lm_block_table(r):
    """The settings sampled more than the tutorial's 200 times, scored per block of 200 (mean ± sd)."""
    rows = sorted((x for x in r["sampling"] if x.get("at_tutorial_n")),
                  key=lambda x: (x["temperature"], x["top_k"] or 0, x["constrained"]))
    if not rows:
        return []
    size = rows[0]["at_tutorial_n"]["size"]
    out = ["", f"Uniqueness (unique valid / n) falls as n grows, because repeats pile up, and novelty of the unique "
               f"ones rises, so rows with n above the tutorial's {size} do not compare with its numbers. Scored per "
               f"block of {size} consecutive samples (mean ± std over the blocks), they do. The results keep no "
               "per-block count of the samples the budget did not force, so a constrained row's block figures count "
               f"budget-forced samples as valid, labelled {FORCED_IN}, with its validity over all n, valid and not "
               "forced, beside them:", "",
           f"| τ | top-k | decoding | blocks of {size} | valid / n | unique valid / n | novel unique / unique valid | "
           "reference (valid / unique / novel) |", "|---|---|---|---|---|---|---|---|"]
    def pm(v):
        return "–" if v["mean"] is None else f"{v['mean']:.3f}" + (f" ± {v['sd']:.3f}" if v["sd"] is not None else "")
    for x in rows:
        b = x["at_tutorial_n"]
        tag = f" {FORCED_IN}" if forced_in(x) else ""
        valid = pm(b["validity"]) + (f" {FORCED_IN}; over all n, not forced: {valid_not_forced(x):.3f}" if tag else "")
        out.append(f"| {x['temperature']} | {x['top_k'] or 'all'} | {'constrained' if x['constrained'] else 'free'} | "
                   f"{b['blocks']} | {valid} | {pm(b['uniqueness'])}{tag} | {pm(b['novelty'])}{tag} | "
                   + _lm_ref_cell(x) + " |")
    return out


def _lm_distribution_table(r):
    """The distribution metrics (against the training split) and the n-gram's fit, as README lines."""
    d, ng = r.get("distribution") or {}, r.get("ngram")
    out = []
    if ng:
        boot = ng.get("paired_bootstrap") or {}
        orders = sorted({x["n"] for x in ng.get("grid", [])}) or [ng["n"]]
        out += [f"n-gram baseline ({ng['n']}-gram, {ng.get('variant', 'interpolated')} Kneser-Ney, discount "
                f"{ng['discount']}; n in {orders[0]}–{orders[-1]}, the variant and the discount chosen on valid): test "
                f"{ng['fit']['test']['bits_per_token']:.3f} bits/token against the Transformer's (seed 0) "
                f"{r['fit']['test']['bits_per_token']:.3f}"
                + (f"; paired bootstrap over the {boot['n_items']} test molecules (seed 0), Transformer − n-gram "
                   f"bits/molecule {boot['diff']:.2f} [{boot['ci_low']:.2f}, {boot['ci_high']:.2f}]" if boot else "")
                + ".", ""]
    if not d:
        return out
    if not d.get("available"):
        return out + [f"*Distribution metrics not computed: {d.get('reason')}*"]
    v = d["versions"]
    out += [f"Distribution metrics against the training split (guacamol {v['guacamol']} `KLDivBenchmark`, fcd "
            f"{v['fcd']}; MOSES-style metrics with RDKit Morgan r2 1024 bits); samples without <eos> count as "
            "invalid; the metrics use every valid sample, budget-forced ones included: a constrained row's *valid* "
            "says so, with the count valid and not forced beside it:", "",
            "| set | n | valid | KL score | KL score at the test split's size | FCD | FCD score | IntDiv1 | SNN | "
            "Frag | Scaf | mean tokens | ≥ 90 tokens, of the valid |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in d["rows"]:
        out.append(f"| {_dist_label(x)} | {x['n']} | {_dist_valid_cell(r, x)} | {kit.fmt(x['kl']['score'])} | "
                   f"{_kl_at_size(x)} | "
                   f"{kit.fmt(x['fcd']['fcd'], '.2f')} | {kit.fmt(x['fcd']['score'])} | {kit.fmt(x['int_div1'])} | "
                   f"{kit.fmt(x['snn'])} | {kit.fmt(x['frag'])} | {kit.fmt(x['scaf'])} | "
                   f"{kit.fmt(x['mean_tokens'], '.1f')} | {share_ci(x['share_long'], x.get('n_valid'), True)} |")
    if any("kl_at_size" in x for x in d["rows"]):
        out += ["", "GuacaMol's KL score uses min(unique valid samples, training size) molecules and rises with that "
                "number (its histograms and kernel densities are noisier on fewer), so the sets compare like for like "
                "only at one size: the column \"at the test split's size\" scores every set on random subsets of as "
                "many unique valid molecules as the test split has (mean ± std over the subsets; "
                "`generation_metrics.kl_score_at_size`), and the reading uses it."]
    return out


def _dist_valid_cell(r, x):
    """A distribution row's valid count: labelled FORCED_IN on a constrained row, with the count valid and not
    forced from its sampling row (the Transformer's or the n-gram's, same setting and n) where there is one."""
    if not x.get("constrained"):
        return str(x["n_valid"])
    rows = r["sampling"] if x["source"] == "Transformer" else (r.get("ngram") or {}).get("sampling", [])
    same = next((s for s in rows if (s["temperature"], s["top_k"], s["constrained"], s["n"])
                 == (x["temperature"], x["top_k"], True, x["n"]) and s.get("n_valid") == x["n_valid"]), None)
    if same is None or "forced_share" not in same:
        return f"{x['n_valid']} {FORCED_IN}"
    return n_valid_cell(same, x["n_valid"])


def _kl_at_size(x):
    """'mean ± sd (n)' of a row's KL score at the test split's size, '–' in results without it."""
    k = x.get("kl_at_size")
    if not k or k["mean"] is None:
        return "–"
    return f"{k['mean']:.3f}" + (f" ± {k['sd']:.3f}" if k["repeats"] > 1 else "") + f" (n {k['size']})"


def _lm_extended_lines(r):
    ext = r.get("extended")
    if not ext:
        return ["*Extended rows (SELFIES model, seeds 1 and 2) are not in this results file: "
                "`python demos/demo_smiles_lm.py --extended` adds them.*"]
    out = ["| model | test bits/token (of its own tokens) | test bits/molecule | free validity τ 1.0 | free "
           "uniqueness τ 1.0 | free novelty τ 1.0 (novel unique / unique valid) | samples |",
           "|---|---|---|---|---|---|---|"]
    runs = [("SMILES, seed " + str(0), r)] + [(f"SMILES, seed {s}", x) for s, x in ext.get("seeds", {}).items()]
    if "selfies" in ext:
        runs.append(("SELFIES, seed 0", ext["selfies"]))
    for label, x in runs:
        t1 = next(s for s in x["sampling"] if s["temperature"] == 1.0 and not s["top_k"] and not s["constrained"])
        b = t1.get("at_tutorial_n")
        out.append(f"| {label} | {x['fit']['test']['bits_per_token']:.3f} | "
                   f"{x['fit']['test']['bits_per_molecule']:.1f} "
                   f"| {_spread_cell(t1, 'validity')} | {_spread_cell(t1, 'uniqueness')} | "
                   f"{_spread_cell(t1, 'novelty')} | "
                   + (f"{t1['n']:,}, scored per {b['size']} (mean ± std of {b['blocks']} blocks) |" if b
                      else f"{t1['n']:,} |"))
    return out


def _spread_cell(x, key):
    """A row's validity, uniqueness or novelty at the tutorial's n: the mean ± std over its blocks of 200 (the
    spread of a 200-sample rate, measured), or, without blocks, the rate with its Wilson interval."""
    b = x.get("at_tutorial_n")
    if b:
        v = b[key]
        return "–" if v["mean"] is None else f"{v['mean']:.3f} ± {kit.fmt(v['sd'])}"
    return rate_cells(x)[{"validity": 0, "uniqueness": 1, "novelty": 2}[key]]


SMILES_LM_DIFFERENCES = [
    "Scaffold split from `chemdata.scaffold_split` (= DeepChem 2.8's ScaffoldSplitter): 902/113/113 molecules; "
    "the tutorial lists 902/112/114.",
    "The {vocab}-id vocabulary is reproduced as 4 specials + the {vocab_top} most frequent training tokens (ties "
    "alphabetical); "
    "the rarer training symbols become <unk> (listed above).",
    "Optimiser: §6.5 states peak learning rate 2e-3 to 4e-3, 150 warmup steps, global-norm clipping at 1.0 and "
    "\"batch size 1\" with gradient accumulation (the accumulation size unstated). Ours: {batch} samples accumulated "
    "per Adam step ({steps} steps in all), peak {lr}, {warmup}, clipping at {clip}; the ladder's first "
    "rung, \"tutorial recipe\", is this run's recipe, so it departs from §6.5 in the same ways. Bits/token are "
    "token-weighted over every target including <eos>.",
    "The constraint closes a molecule when the model chooses <eos> where it cannot end yet (`close_on_eos`: the "
    "model picks among the closings), and its token budget is never below the longest training molecule; earlier "
    "runs sampled around a masked <eos> with a budget of 60 tokens (the probe table compares the two).{candidate}",
    "Added: grammar + valence constrained sampling (`smiles_grammar.SmilesConstraint`: branches, ring bonds, valences, "
    "aromatic atoms kept on rings and aromatic systems kekulizable by the constraint's own valence and Kekulé "
    "model (exact for that model at <eos>; RDKit's model differs, e.g. on an aromatic n(=O), so RDKit still rejects "
    "a few molecules that end with <eos>: the sampling table's failures after <eos>), and a token budget so every "
    "molecule can be closed, checked by a bounded search near the end of the budget), with `backtrack={backtrack}` in "
    "`generate` for dead ends the mask cannot foresee, for every "
    "setting; failure categories (the project's classifier of RDKit's problems, smiles_failure_reason), cached "
    "vs uncached speed, and under --extended a SELFIES model and "
    "seeds 1, 2.", "{streams}",
    "Every sample is cut at {cap} new tokens (the tutorial states no cap). {added}"
    "A sample that did not emit <eos> within the token budget is invalid (`no_eos`) whatever RDKit says of the "
    "prefix. Uniqueness and novelty columns use the tutorial's definitions (unique valid / n; novel unique / unique "
    "valid); novel / valid is ours, labelled so.",
    "Added: the τ = 1.0 settings (free and constrained, all tokens and top-k 5) sampled {headline} for GuacaMol's KL "
    "and FCD scores and MOSES-style IntDiv1 / SNN / Frag / Scaf against the training split, with reference rows "
    "(training resampled, test split) and token-length histograms; tokens/s per setting.",
    "Added under --extended: a recipe ladder beyond the tutorial (per-token loss, early stopping on validation "
    "bits/token, dropout at a rate chosen on validation from {rates} (the tutorial's range 0.05–0.2), "
    "randomized-SMILES augmentation), {rung_seeds} seeds a rung at the tutorial's size, trained through "
    "`torch_bridge` (the same model and recipe; its dropout masks come from torch's RNG) and paired against the "
    "tuned n-gram; the tutorial's rows keep its recipe and no dropout.",
    "Added: an atom-token n-gram baseline (interpolated or modified Kneser-Ney, n in {orders} and the discount "
    "chosen on valid, the choice checked to be inside the grid), sampled through the same `generate` path at the "
    "τ = 1.0 settings with the same constraint; the tutorial has none."]


QUESTION = ("Can a small Transformer learn SMILES well enough, trained on ESOL's "
            f"{SMILES_LM_REF['split'][0]} training molecules, to generate "
            "valid, unique and novel molecules, and what does a grammar and valence constraint on sampling add? The "
            f"tutorial's answer: test {SMILES_LM_TEST_BITS} bits/token, and at τ = 1.0 only "
            f"{SMILES_LM_REF['sampling'][(1.0, None)][0]:.1%} of the samples are valid SMILES; it calls the model an "
            "n-gram statistics machine without training one.")
FIGURES = [fig_smiles_lm_fit, fig_smiles_lm_sampling, fig_smiles_lm_failures, fig_smiles_lm_grid,
           fig_smiles_lm_distribution, fig_smiles_lm_lengths, fig_smiles_lm_shapes]


def _data_line(payload):
    r = payload["results"]
    d, m, sp = r["data"], r["model"], r["speed"]
    return (f"Split {d['split_sizes']['train']}/{d['split_sizes']['valid']}/{d['split_sizes']['test']} (tutorial "
            f"{'/'.join(map(str, SMILES_LM_REF['split']))}); vocabulary {d['vocab_size']} ids, <unk> symbols "
            + (", ".join(f"`{k}` ({v})" for k, v in d["unk_symbols"].items()) or "none")
            + f"; <unk> occurrences train/valid/test {d['unk_counts']['train']}/{d['unk_counts']['valid']}/"
            f"{d['unk_counts']['test']}. {m['parameters']:,} parameters (reference {SMILES_LM_REF['params']:,}); "
            f"batch {m['batch_size']}, {m['n_steps']} steps, training {m['train_wall_time_s'] / 60:.1f} min, sampling "
            f"all {len(r['sampling'])} settings {sp['sampling_wall_time_s'] / 60:.1f} min" + _whole_wall(payload) + ".")


def _whole_wall(payload):
    """The tutorial's wall time is its whole experiment: set beside this run's whole experiment, mode named."""
    if payload.get("wall_time_s") is None:
        return f" (the tutorial's {SMILES_LM_REF['wall_min']} min, on a faster laptop, is its whole experiment)"
    mode = payload.get("mode", "default")
    extra = ("; not like for like: extended mode adds seeds, the n-gram, the recipe ladder and the probes"
             if mode == "extended" else "")
    resumed = payload.get("resumed_stages") or kit.was_resumed(payload.get("results"))
    if resumed:
        stages = (f" ({len(payload['resumed_stages'])} stages read back from its checkpoints)"
                  if payload.get("resumed_stages") else "")
        return (f"; a resumed {mode} run: at least {recorded_wall_s(payload['results']) / 60:.1f} min, the sum of the "
                f"stage times the results record over its calls (its last call {payload['wall_time_s'] / 60:.1f} "
                f"min{stages}; the training and sampling times above come from the calls that ran them), against "
                f"the tutorial's whole experiment, {SMILES_LM_REF['wall_min']} min on a faster laptop{extra}")
    return (f", the whole experiment {payload['wall_time_s'] / 60:.1f} min in {mode} mode "
            f"(the tutorial's whole experiment: {SMILES_LM_REF['wall_min']} min on a faster laptop{extra})")


def _extras(r):
    sp = r["speed"]
    return (_lm_distribution_table(r) + ["", f"Sampling speed, one process: {sp['cached']['tokens_per_s']:.0f} "
            f"tokens/s with the K/V cache, {sp['uncached']['tokens_per_s']:.0f} without ({sp['speedup']:.1f}×; "
            f"identical samples: {'yes' if sp['identical'] else 'NO'}).", ""] + _lm_extended_lines(r) + [""]
            + _lm_shape_lines(r) + [""] + _lm_candidate_lines(r) + [""] + _lm_probe_lines(r) + [""]
            + _lm_ladder_lines(r))


def _figures(r):
    names = [("fit", "smiles_lm_fit"), ("sampling", "smiles_lm_sampling"), ("failures", "smiles_lm_failures"),
             ("samples", "smiles_lm_grid")]
    if _dist_rows(r):
        names += [("distribution", "smiles_lm_distribution"), ("lengths", "smiles_lm_lengths"),
                  ("free samples", "smiles_lm_grid_free"), ("n-gram samples", "smiles_lm_grid_ngram"),
                  ("training molecules", "smiles_lm_grid_train")]
    if r["data"].get("train_shape"):
        names.append(("sample shapes", "smiles_lm_shapes"))
    return names


def _lr(x):
    """A learning rate as §6.5 writes it: 3e-3."""
    return f"{x:.0e}".replace("e-0", "e-")


def _streams_sentence(r):
    """How this run's samples drew their random numbers: per setting (``sampling_sizes.streams``); a run without
    that record predates per-setting streams (issue 53): an error rather than a sentence untrue of it."""
    if r["sampling_sizes"]["streams"] == "per setting":
        return ("Samples come from `parallel_map`, each from its own random stream keyed by the model, seed, τ, top-k, "
                "free or constrained and its index in the setting (`setting_stream`): they depend neither on the "
                "worker count nor on the other settings' sample counts, so a default run's rows are the first n of "
                "an --extended run's; the probe's constraint variants share one stream.")
    raise ValueError(f"sampling_sizes.streams {r['sampling_sizes']['streams']!r}: not a stream layout this page knows")


def _added_settings(r):
    """'Added: the settings ... (the tutorial reports ...). ': free settings sampled here, without tutorial figures."""
    extra = sorted({(x["temperature"], x["top_k"]) for x in r["sampling"] if not x["constrained"]}
                   - set(SMILES_LM_REF["sampling"]), key=lambda k: (k[0], k[1] or 0))
    if not extra:
        return ""
    return ("Added: " + "; ".join(f"τ {t} with top-k {k or 'all'}" for t, k in extra) + f" (the tutorial reports "
            f"{len(SMILES_LM_REF['sampling'])} of the {len(extra) + len(SMILES_LM_REF['sampling'])} free settings). ")


def _differences(payload):
    """SMILES_LM_DIFFERENCES with this run's settings filled in."""
    c, r = payload["config"], payload["results"]
    m, lad, ng = r["model"], r.get("ladder"), r.get("ngram") or {}
    orders = sorted({g["n"] for g in ng.get("grid", [])})
    fill = {"{headline}": f"{r['sampling_sizes']['headline']:,} times in this {payload.get('mode', 'default')} run",
            "{orders}": f"{orders[0]}–{orders[-1]}" if orders else "a grid",
            "{rung_seeds}": str(len(lad["seeds"])) if lad else "",
            "{rates}": ", ".join(f"{x:g}" for x in lad["dropout_rates"]) if lad else "",
            "{backtrack}": str(c.get("backtrack", 0)), "{batch}": str(m["batch_size"]), "{steps}": f"{m['n_steps']:,}",
            "{lr}": _lr(c["lr"]) + (" (inside §6.5's range)" if 2e-3 <= c["lr"] <= 4e-3 else " (outside §6.5's range)"),
            "{warmup}": f"{c['warmup']} warmup steps ({'§6.5' if c['warmup'] == 150 else 'not §6.5'}'s"
            + ("" if c["warmup"] == 150 else " 150") + f"; {c['warmup'] / m['n_steps']:.0%} of the steps)",
            "{clip}": f"{c['clip']:g}", "{cap}": str(c.get("max_new_tokens", "?")),
            "{vocab}": str(r["data"]["vocab_size"]), "{vocab_top}": str(r["data"]["vocab_size"] - 4),
            "{added}": _added_settings(r), "{streams}": _streams_sentence(payload["results"]),
            "{candidate}": r.get("constraint_candidate") and " The candidate (+ no ring above the training maximum "
            "among the rings a molecule ends with, so fused rings such as c1cccc2ccccc12 pass, + `lookahead`: a "
            "token only if a search of at most 30 states finds a completion the constraint's own checks accept within "
            "60 tokens or the budget's when fewer, run on the tokens a draw may pick) is sampled "
            "on every constrained setting with the same random streams: the before → after table." or ""}
    out = []
    for x in SMILES_LM_DIFFERENCES:
        if "{rung_seeds}" in x and not lad:
            continue                        # the recipe ladder runs under --extended only
        for k, v in fill.items():
            x = x.replace(k, v)
        out.append(x)
    return out


def page(payload):
    """Experiment 4's page parts (report_kit.Page)."""
    r = payload["results"]
    comparison = ([_data_line(payload), ""] + _lm_fit_table(r) + [""]
                  + _lm_sampling_table(r, payload["config"].get("max_new_tokens", "?")))
    return kit.Page(comparison, reading(r), _differences(payload), _extras(r), _figures(r))


def _headline_seeds(r):
    """Per seed (seed 0, then --extended's), the τ = 1.0 figures of the overview row: test bits/token, free
    validity, its validity under 10 tokens and from 20, constrained validity counting no budget-forced sample,
    the share closed at an early <eos>, and the valid samples' share with a ring larger than any in training."""
    fits = [x["fit"]["test"]["bits_per_token"] for x in [r] + list(r.get("extended", {}).get("seeds", {}).values())]
    out = []
    for bits, by in zip(fits, seed_rows(r)):
        free, con = by[(1.0, None, False)], by[(1.0, None, True)]
        short, long_ = _short_long_validity(free) if "validity_by_length" in free else (None, None)
        out.append((bits, free["validity"], short, long_, valid_not_forced(con), con.get("closed_on_eos_share"),
                    (con.get("shape") or {}).get("share_ring_larger_than")))
    return out


def headline(r):
    """The overview row, as the mean ± std over the seeds (seed 0 alone without --extended), as the reading:
    test bits/token; at τ = 1 the free validity with its length context (short samples are the valid ones) and
    the constrained validity counting no budget-forced sample, with what the constraint did to reach it (closed
    at an early <eos>) and the valid samples' rings larger than any in training."""
    ref = SMILES_LM_REF
    bits, free, short, long_, con, closed, ring = zip(*_headline_seeds(r))
    n = len(bits)
    ctx = (f" (≥20 tok. {kit.mean_cell(long_, '.2f', pm='±')})"
           if kit.mean_cell(short) and kit.mean_cell(long_) else "")
    work = (f" ({kit.mean_cell(closed, pct=True)} shut at <eos>; {kit.mean_cell(ring, pct=True)} rings>train w/ "
            "forced)" if kit.mean_cell(closed) and kit.mean_cell(ring) else "")
    seeds = f" ({n} seeds)" if n > 1 else ""
    tut = ref["sampling"][(1.0, None)][0]
    where = (f" ({'inside' if min(free) <= tut <= max(free) else 'outside'} seeds)" if n > 1 and
             None not in free else "")
    least = min(by[(1.0, None, False)]["n"] for by in seed_rows(r))         # the seeds' sample counts
    ns = f"n≥{least / 1000:g}k" if least >= 1000 else f"n≥{least}"
    return (f"{kit.mean_cell(bits, pm='±')} bits/token{seeds}; τ=1 valid ({ns}): free "
            f"{kit.mean_cell(free, pm='±')}{ctx}; constr. unforced {kit.mean_cell(con, pm='±')}{work}",
            f"{ref['fit']['test'][0]:.3f}; {tut:.3f}{where}, –")
