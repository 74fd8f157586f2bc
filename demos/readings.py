"""Readings that a demo prints and make_figures.py writes into the README: one function per study that
needs both, computed from the results dict alone (so the README can regenerate it from the committed
JSON), standard library only (so a demo can use it without matplotlib).

    import readings
    text = readings.smiles_lm(results)          # experiment 4; the README puts '*Reading:* ' before it
"""

SMILES_LM_TEST_BITS = 2.812        # the tutorial's test bits/token of experiment 4
SMILES_TARGET_VALIDITY = 0.95      # the issue's target for constrained sampling at tau = 1.0
SMILES_KL_MARGIN = 0.05            # constrained KL score within this of the test split's (issue 20's target)
SMILES_MAX_LONG_SHARE = 0.02       # at most this share of constrained samples >= 90 tokens (issue 20's target)


def _g(x, fmt=".3f"):
    return "–" if x is None else format(x, fmt)


def _mean_sd(values):
    """(mean, sample standard deviation; 0.0 for a single value)."""
    m = sum(values) / len(values)
    return m, (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0


def _smiles_lm_seed_stats(r):
    """(bits/token, free validity, constrained validity) at τ = 1.0 per seed: seed 0, then --extended's."""
    out = []
    for x in [r] + list(r.get("extended", {}).get("seeds", {}).values()):
        by = {(s["temperature"], s["top_k"], s["constrained"]): s for s in x["sampling"]}
        out.append((x["fit"]["test"]["bits_per_token"], by[(1.0, None, False)]["validity"],
                    by[(1.0, None, True)]["validity"]))
    return out


def _smiles_lm_failures(r, con):
    """The sentences on what the constraint cannot see: invalid samples that ended with <eos>, dead ends."""
    text, left = "", {}
    for x in r["sampling"]:
        if x["constrained"]:
            for k, v in x["failures_after_eos"].items():
                left[k] = left.get(k, 0) + v
    if left:
        top = max(left, key=left.get)
        text += (f" What the constraint cannot see still fails: {sum(left.values())} constrained samples that ended "
                 f"with <eos> are invalid, {left[top]} of them by {top.replace('_', ' ')}.")
    stuck = con.get("stop_reason_counts", con["stop_reasons"]).get("no_allowed_token", 0)
    if stuck:
        text += (f" At τ = 1.0 (seed 0), {stuck} of {con['n']} constrained samples stopped at a dead end that "
                 "backtracking could not undo, and count as invalid.")
    return text


def tutorial_novelty(x):
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
    return tutorial_novelty(x) if key == "novelty" else x[key]


def _ngram_sentence(r):
    """Does the Transformer beat the n-gram on test bits/token: a gap beyond the seed spread (when
    --extended ran seeds) and a paired bootstrap over the test molecules whose interval excludes 0."""
    ng = r.get("ngram")
    if not ng:
        return ""
    bits = [x[0] for x in _smiles_lm_seed_stats(r)]
    mean, sd = _mean_sd(bits)
    gap = mean - ng["fit"]["test"]["bits_per_token"]
    boot = ng.get("paired_bootstrap")
    text = (f" The {ng['n']}-gram (Kneser-Ney, discount {ng['discount']}, both chosen on valid) scores "
            f"{ng['fit']['test']['bits_per_token']:.3f} test bits/token, the Transformer {mean:.3f} "
            f"({abs(gap):.3f} {'lower' if gap < 0 else 'higher'}")
    text += f"; seed spread {sd:.3f})" if len(bits) > 1 else "; one seed, no spread)"
    if boot:
        text += (f"; paired bootstrap over {boot['n_items']} test molecules, Transformer − n-gram bits/molecule "
                 f"{boot['diff']:.2f} [{boot['ci_low']:.2f}, {boot['ci_high']:.2f}]")
    beats = gap < 0 and (len(bits) == 1 or -gap > sd) and boot is not None and boot["ci_high"] < 0
    worse = gap > 0 and (len(bits) == 1 or gap > sd) and boot is not None and boot["ci_low"] > 0
    verdict = ("the Transformer beats the n-gram" if beats else "the n-gram beats the Transformer" if worse
               else "neither beats the other beyond the spread and the paired interval")
    return text + f": {verdict}."


def kl_like_for_like(x):
    """A row's KL score at the test split's size (``kl_at_size``, the like-for-like one: the score rises
    with the sample size) where the results have it, else its KL score on the whole set."""
    return x["kl_at_size"]["mean"] if "kl_at_size" in x else x["kl"]["score"]


def _distribution_sentence(r):
    """Issue 20's constraint targets at τ = 1.0 from the distribution table: KL score of constrained >=
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
    above = (f"; the constrained samples score {kc - kt:.3f} above the test split, closer to the training "
             "distribution than these held-out molecules (a scaffold split holds out unlike scaffolds)"
             if kc > kt + SMILES_KL_MARGIN else "")
    return (f" Against the training split at τ = 1.0, GuacaMol KL score{size} free {kf:.3f}, constrained {kc:.3f}, "
            f"test split {kt:.3f}{above}; FCD score free {_g(free['fcd']['score'])}, constrained {_g(con['fcd']['score'])}, "
            f"test split {_g(test['fcd']['score'])}; constrained samples ≥ {con['long_tokens']} tokens: "
            f"{con['share_long']:.1%}. The constraint {'meets' if ok_kl and ok_long else 'misses'} the target "
            f"(KL ≥ free's and at most {SMILES_KL_MARGIN} below the test split's: {'yes' if ok_kl else 'no'}; "
            f"≤ {SMILES_MAX_LONG_SHARE:.0%} long: {'yes' if ok_long else 'no'}).")


def _per_block_label(x):
    b = x.get("at_tutorial_n")
    return (f", per {b['size']} samples as in the tutorial (mean over {b['blocks']} blocks of the {x['n']:,})"
            if b else "")


def smiles_lm(r):
    """Experiment 4: test bits/token against the tutorial's (judged by the seed spread when --extended
    ran more seeds), and what the grammar + valence constraint does to validity at τ = 1.0."""
    by = {(x["temperature"], x["top_k"], x["constrained"]): x for x in r["sampling"]}
    free, con = by[(1.0, None, False)], by[(1.0, None, True)]
    stats = list(zip(*_smiles_lm_seed_stats(r)))
    n = len(stats[0])
    (bits, bits_sd), (v_free, v_free_sd), (v_con, v_con_sd) = (_mean_sd(list(x)) for x in stats)
    pm = (lambda m, sd: f"{m:.3f} ± {sd:.3f}") if n > 1 else (lambda m, sd: f"{m:.3f}")
    gap = bits - SMILES_LM_TEST_BITS
    spread = (f"beyond the seed spread of {bits_sd:.3f}" if abs(gap) > bits_sd else
              f"within the seed spread of {bits_sd:.3f}") if n > 1 else "one seed: no spread to judge it"
    seeds = f" (mean ± std over {n} seeds)" if n > 1 else ""
    text = (f"test bits/token {pm(bits, bits_sd)}{seeds} is {abs(gap):.3f} "
            f"{'above' if gap > 0 else 'below'} the tutorial's {SMILES_LM_TEST_BITS} ({spread}). At τ = 1.0 the "
            f"grammar + valence constraint lifts RDKit validity from {pm(v_free, v_free_sd)} to {pm(v_con, v_con_sd)}, ")
    text += ("meeting" if v_con >= SMILES_TARGET_VALIDITY else "short of") + \
        f" the {SMILES_TARGET_VALIDITY:.0%} target; seed 0" + _per_block_label(free) + \
        f": uniqueness {at_tutorial_n(free, 'uniqueness'):.3f} → {at_tutorial_n(con, 'uniqueness'):.3f}, novelty " \
        f"(the tutorial's: novel unique / unique valid) {_g(at_tutorial_n(free, 'novelty'))} → " \
        f"{_g(at_tutorial_n(con, 'novelty'))}."
    return text + _smiles_lm_failures(r, con) + _ngram_sentence(r) + _distribution_sentence(r)


# ----------------------------------------------------------------------------- experiment 5: the attention heads
import math  # noqa: E402  (experiment 5's section only)

ATTENTION_CHEM_TUTORIAL = {"ring": 0.040, "branch": 0.057, "uniform": 0.030}   # the tutorial's best heads, its baseline
ATT_RING_RATIO = 2.0     # "attends": mass at the predicting query >= 2x the causal-uniform baseline there ...
ATT_OFFSET_RATIO = 1.5   # ... and >= 1.5x the same head's mass at the same distance back, whatever the token
ATT_ABLATION = 0.05      # "needed": ablated, >= 0.05 bits/token more on those targets than on all tokens, and the
                         # paired bootstrap over test molecules against the random head's ablation above 0 (95 %)
                         # "beats the n-gram": experiment 4's rule (_ngram_sentence): lower test bits/token, by more
                         # than the seed spread when there are seeds, and its paired bootstrap interval below 0
POSITION_TIE = 1.25      # a position is "most likely" the tutorial's only if it is 1.25x nearer than the other
NGRAM_KEYS = (("ngram", "test", "bits_per_token"), ("ngram", "test_bits_per_token"), ("ngram", "bits_per_token"),
              ("ngram", "fit", "test", "bits_per_token"), ("ngram_baseline", "test", "bits_per_token"),
              ("ngram_baseline", "test_bits_per_token"), ("ngram_baseline", "bits_per_token"))


def _dig(d, keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def smiles_lm_bits(r):
    """Experiment 4's test bits/token: the Transformer's (mean, and sample std over its seeds when
    --extended ran more) and the n-gram baseline's (None when those results do not have it), with
    experiment 4's paired bootstrap over test molecules (Transformer - n-gram bits/molecule) if present."""
    vals = [r["fit"]["test"]["bits_per_token"]] + [s["fit"]["test"]["bits_per_token"]
                                                    for s in r.get("extended", {}).get("seeds", {}).values()]
    m, sd = _mean_sd(vals)
    ng = next((v for v in (_dig(r, k) for k in NGRAM_KEYS) if isinstance(v, (int, float))), None)
    return {"ngram_bits_per_token": ng, "transformer_bits_per_token": m,
            "transformer_seed_sd": sd if len(vals) > 1 else None, "n_seeds": len(vals),
            "paired_bootstrap": _dig(r, ("ngram", "paired_bootstrap"))}


def attention_chem_position(r):
    """Which query the tutorial's table most likely used: the position where our best ring and branch
    heads' mass / whole-molecule uniform is nearer the tutorial's (mean |ln ours - ln tutorial's|)."""
    tut, best, dist, parts = ATTENTION_CHEM_TUTORIAL, r["best"], {}, []
    for pos in ("holding", "predicting"):
        ratios = {k: best[f"{k}_{pos}"]["ratio_to_whole_molecule_uniform"] for k in ("ring", "branch")}
        d = [abs(math.log(v) - math.log(tut[k] / tut["uniform"])) for k, v in ratios.items() if v]
        dist[pos] = sum(d) / len(d) if d else None
        parts.append(f"{pos} ring {_g(ratios['ring'], '.1f')}x, branch {_g(ratios['branch'], '.1f')}x")
    text = (f"Best-head partner mass over whole-molecule uniform: {'; '.join(parts)}; the tutorial's "
            f"{tut['ring'] / tut['uniform']:.1f}x and {tut['branch'] / tut['uniform']:.1f}x. ")
    if None in dist.values():
        return text + "Without partners at both positions the tutorial's position cannot be judged."
    near, far = sorted(dist, key=dist.get)
    if dist[far] < POSITION_TIE * dist[near]:
        return text + (f"Its table is as near one position as the other (mean log distance {dist['holding']:.2f} "
                       f"vs {dist['predicting']:.2f}): which it used cannot be told.")
    return text + (f"Its table most likely used the query {near} the closing token (mean log distance "
                   f"{dist[near]:.2f} vs {dist[far]:.2f}; a weak indication, our model is not the tutorial's).")


def _att_head(r, name, kind):
    """(attends, needed, sentence) for one named head: its test mass at the predicting query against
    both controls, and its held-out ablation on the ``kind`` targets against the random head's."""
    c, t = r["chosen"][name], r["splits"]["test"]
    h = next(x for x in t["heads"] if (x["layer"], x["head"]) == (c["layer"], c["head"]))
    base, m, off = (t["baselines"][f"{kind}_predicting"]["causal_uniform"], h[f"{kind}_predicting"],
                    h[f"{kind}_predicting_offset"])
    dk, d, vs = c["test"][f"{kind}_delta"], c["test"]["delta"], (c.get("vs_random") or {}).get(kind)
    if m is None or dk is None or vs is None:
        return False, False, f"layer {c['layer']} head {c['head']}: no {kind} closures among the test molecules."
    attends = m >= ATT_RING_RATIO * base and m >= ATT_OFFSET_RATIO * off
    needed = dk - d >= ATT_ABLATION and vs["ci_low"] > 0
    text = (f"layer {c['layer']} head {c['head']} (chosen on validation by {c['chosen_by']}) puts {m:.3f} on the "
            f"{kind} opener at the predicting query of the test molecules ({m / base:.1f}x causal-uniform, "
            f"{m / off:.1f}x its mass at the same offset); ablated, {kind}-closing targets cost {dk:+.3f} and all "
            f"tokens {d:+.3f} bits/token, {vs['diff']:+.3f} [{vs['ci_low']:+.3f}, {vs['ci_high']:+.3f}] against "
            f"the random head's ablation: {'attends' if attends else 'does not attend'} by the thresholds, "
            f"{'needed' if needed else 'not needed'} there.")
    return attends, needed, text


def _att_ngram(r):
    """(beats or None, sentence): experiment 4's Transformer against its n-gram baseline, test bits/token."""
    ng = r.get("ngram") or {}
    if ng.get("ngram_bits_per_token") is None:
        return None, (f"Experiment 4's n-gram baseline is absent ({ng.get('why_not', 'no record')}): whether "
                      "the model is 'only an n-gram' cannot be judged here.")
    gap, sd = ng["ngram_bits_per_token"] - ng["transformer_bits_per_token"], ng.get("transformer_seed_sd")
    boot = ng.get("paired_bootstrap")
    beats = gap > 0 and (sd is None or gap > sd) and boot is not None and boot["ci_high"] < 0
    spread = "one seed, no spread" if sd is None else f"mean of {ng.get('n_seeds')} seeds, spread {sd:.3f}"
    paired = ("no paired test recorded" if boot is None else
              f"paired bootstrap, Transformer − n-gram bits/molecule {boot['diff']:.2f} "
              f"[{boot['ci_low']:.2f}, {boot['ci_high']:.2f}]")
    return beats, (f"Experiment 4: Transformer {ng['transformer_bits_per_token']:.3f} against n-gram "
                   f"{ng['ngram_bits_per_token']:.3f} test bits/token ({spread}; {paired}): it "
                   f"{'beats' if beats else 'does not beat'} the n-gram.")


def attention_chem(r):
    """Experiment 5: at which position the partner mass is, whether a head tracks ring closure (chosen on
    validation, judged on test), and whether the model is 'only an n-gram', from the thresholds above."""
    ring = [_att_head(r, n, "ring") for n in ("ring_head", "ring_ablation_head")]
    branch = _att_head(r, "branch_head", "branch")
    tracks = any(a and n for a, n, _ in ring)
    beats, ngram_text = _att_ngram(r)
    controls = "; ".join(
        f"{label} (layer {c['layer']} head {c['head']}) {_g(c['test']['ring_delta'], '+.3f')} on ring closures, "
        f"{_g(c['test']['delta'], '+.3f')} on all tokens" for label, c in
        (("random head", r["chosen"]["random_head"]), ("previous-token head", r["chosen"]["prev_token_head"])))
    text = (attention_chem_position(r) + " Ring head: " + ring[0][2] + " Ring-ablation head: " + ring[1][2]
            + " Branch head: " + branch[2] + f" Controls ablated on test: {controls}. " + ngram_text + " ")
    if tracks:
        text += "So a head tracks ring closure (it attends to the opener and the model needs it there)"
        text += {True: ", and the model is more than an n-gram.", False: ", although the model is no better "
                 "than the n-gram on bits/token.", None: "; the n-gram comparison is missing."}[beats]
    elif beats is None:
        text += "So no head tracks ring closure by these thresholds; the n-gram comparison is missing."
    elif beats:
        text += ("So neither: no head tracks ring closure by these thresholds, yet the model beats the n-gram, "
                 "so it is not only an n-gram.")
    else:
        text += "So no head tracks ring closure and the model does not beat the n-gram: consistent with 'only an n-gram'."
    return text


def attention_chem_headline(r):
    """One line for the README overview: the validation-chosen ring head on the test molecules."""
    c = r["chosen"]["ring_head"]
    t = r["splits"]["test"]
    h = next(x for x in t["heads"] if (x["layer"], x["head"]) == (c["layer"], c["head"]))
    return (f"ring head (chosen on validation) {_g(h['ring_predicting'])} at the predicting query vs causal-uniform "
            f"{_g(t['baselines']['ring_predicting']['causal_uniform'])}; ablated: "
            f"{_g(c['test']['ring_delta'], '+.3f')} bits on test ring closures (random head "
            f"{_g(r['chosen']['random_head']['test']['ring_delta'], '+.3f')})")
