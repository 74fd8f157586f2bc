"""Readings that a demo prints and make_figures.py writes into the README: one function per study that
needs both, computed from the results dict alone (so the README can regenerate it from the committed
JSON), standard library only (so a demo can use it without matplotlib).

    import readings
    text = readings.smiles_lm(results)          # experiment 4; the README puts '*Reading:* ' before it
"""

SMILES_LM_TEST_BITS = 2.812        # the tutorial's test bits/token of experiment 4
SMILES_TARGET_VALIDITY = 0.95      # the target for constrained sampling at tau = 1.0


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
    stuck = con["stop_reasons"].get("no_allowed_token", 0)
    if stuck:
        text += (f" At τ = 1.0 (seed 0), {stuck} of {con['n']} constrained samples stopped at a dead end that "
                 "backtracking could not undo, and count as invalid.")
    return text


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
        f" the {SMILES_TARGET_VALIDITY:.0%} target; seed 0: uniqueness {free['uniqueness']:.3f} → " \
        f"{con['uniqueness']:.3f}, novelty {_g(free['novelty'])} → {_g(con['novelty'])}."
    return text + _smiles_lm_failures(r, con)
