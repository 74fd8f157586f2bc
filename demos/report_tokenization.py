"""The supplementary tokenization study's report (demos/demo_tokenization.py, figures/results_tokenization.json):
character, atom and BPE tokens of ESOL SMILES, sequence length against vocabulary.  Its figure, its page
(docs/11-tokenization.md) and its overview row; the interface is report_kit's."""
import report_kit as kit

# The tutorial's table (its appendix E, count rule): scheme -> (vocabulary, mean tokens, ΣT² vs char)
TOKENIZATION_REF = {"char": (31, 22.33, 1.000), "atom": (28, 21.58, 0.940), "BPE@32": (61, 10.70, 0.257),
                    "BPE@64": (93, 8.97, 0.184), "BPE@128": (151, 7.35, 0.125), "BPE@256": (273, 6.08, 0.089),
                    "BPE@512": (513, 4.96, 0.064), "BPE@1024": (733, 4.27, 0.053),
                    "BPE@512+eow": (508, 5.13, 0.068), "stopped_at": 830, "corpus_chars": 17876,
                    "split": (902, 112, 114), "ledger": (17876, 3249)}


def fig_tokenization_lengths(meta, r, out_dir):
    plt = kit.plt()
    sch = r["schemes"]
    base = {x["scheme"]: x for x in sch if x["kind"] != "bpe"}
    RT = TOKENIZATION_REF
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for crit, mk in (("gain", "o-"), ("count", "s--")):
        bpe = [x for x in sch if x["kind"] == "bpe" and not x["end_of_word"] and x.get("criterion", "gain") == crit]
        if not bpe:
            continue
        m = [x["merges_done"] for x in bpe]
        axes[0].semilogx(m, [x["mean_tokens"] for x in bpe], mk, label=f"BPE, {crit} rule")
        axes[1].loglog(m, [x["sum_T2_rel_char"] for x in bpe], mk, label=f"BPE, {crit} rule")
        axes[2].loglog(m, [x["vocab"] for x in bpe], mk, label=f"full vocabulary, {crit} rule")
        axes[2].loglog(m, [x["distinct_tokens_used_all"] for x in bpe], mk, alpha=0.6,
                       label=f"distinct tokens in use, {crit} rule")
    refm = [32, 64, 128, 256, 512, RT["stopped_at"]]
    refv = [RT[f"BPE@{n}"] for n in (32, 64, 128, 256, 512, 1024)]
    for ax, idx in ((axes[0], 1), (axes[1], 2), (axes[2], 0)):
        kit.ref_mark(ax, refm, [v[idx] for v in refv])
    for name, ls in (("char", ":"), ("atom", "-.")):
        if name in base:
            axes[0].axhline(base[name]["mean_tokens"], ls=ls, color="gray", label=f"{name}")
            axes[2].axhline(base[name]["vocab"], ls=ls, color="gray", label=f"{name}")
    axes[0].set(xlabel="merges learned", ylabel="tokens per molecule", title="Mean SMILES length")
    axes[1].set(xlabel="merges learned", ylabel="Σ T² relative to char", title="Attention cost (ratio)")
    axes[2].set(xlabel="merges learned", ylabel="number of tokens", title="Vocabulary (count)")
    for ax in axes:
        kit.legend_below(ax)
    fig.suptitle("Tokenization: BPE trained on the 902 training molecules — " + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "tokenization_lengths")


REPRODUCE_TOKENS = 0.1      # count-rule rows within this many mean tokens of the tutorial's reproduce its table

QUESTION = ("How long is a SMILES string in characters, in atoms and in byte-pair-encoding (BPE) subwords, and "
            "what does a bigger vocabulary buy? The tutorial's answer: 512 BPE merges learned on the training "
            f"molecules shorten the average ESOL molecule about "
            f"{TOKENIZATION_REF['char'][1] / TOKENIZATION_REF['BPE@512'][1]:.1f}× and its attention cost Σ T² about "
            f"{1 / TOKENIZATION_REF['BPE@512'][2]:.0f}×, and character-level BPE cuts through atoms (`l)` from `Cl)`).")
FIGURES = [fig_tokenization_lengths]
DIFFERENCES = [
    "BPE merge rule: ours by measured gain (skipping pairs that recreate a symbol); the tutorial's by raw count is "
    "an option (`bpe.BPE.train(..., criterion=\"count\")`) and both are tabulated.",
    "Training corpus from DeepChem 2.8's scaffold split (different molecules from the tutorial's split).",
    "The caffeine example is shown in both the aromatic and the Kekulé (PubChem) form; the tutorial's exact string "
    "is not in our reference sheet."]
HEADER = ["scheme", "rule", "merges", "vocab (full)", "tokens in use", "mean tokens", "P95", "max", "Σ T² vs char",
          "decodable"]


def _row(x):
    crit = x.get("criterion", "–") if x["kind"] == "bpe" else "–"
    merges = f"{x['merges_done']}" + (" (stopped)" if x.get("stopped_early") else "")
    return [x["scheme"].replace(" (count)", ""), crit, merges, x["vocab"], x["distinct_tokens_used_all"],
            f"{x['mean_tokens']:.2f}", x["p95"], x["max"], f"{x['sum_T2_rel_char']:.3f}",
            f"{100 * x['decodable_fraction']:.0f}%"]


def _ref(x):
    """The tutorial's (vocab, mean, ΣT²) for a count-rule or non-BPE row, None for a gain-rule row."""
    if x["kind"] == "bpe" and x.get("criterion", "gain") != "count":
        return None
    return TOKENIZATION_REF.get(x["scheme"].replace(" (count)", "").replace(" + end-of-word", "+eow"))


def _corpus_rows(r):
    RT, st, gl, sp = TOKENIZATION_REF, r["training_stop"], r["gain_ledger"], r["split"]
    stc = r.get("training_stop_count", {})
    return [["training SMILES: characters", f"{gl['n_initial_tokens']:,}", f"{RT['corpus_chars']:,}"],
            ["scaffold split train/valid/test", f"{sp['n_train']}/{sp['n_valid']}/{sp['n_test']}",
             "/".join(map(str, RT["split"]))],
            ["BPE@1024 stops by itself after (merges): gain rule; count rule",
             f"{st['n_merges_done']}; {stc.get('n_merges_done', '–')}", RT["stopped_at"]],
            ["gain ledger: characters − tokens = gain", f"{gl['n_initial_tokens']} − {gl['n_final_tokens']} = "
             f"{gl['difference']}", f"{RT['ledger'][0]} − {RT['ledger'][1]} = {RT['ledger'][0] - RT['ledger'][1]}"]]


def _comparison(r):
    rows = [(x, _ref(x)) for x in r["schemes"]]
    like = [_row(x) + [f"{rf[0]}, {rf[1]:.2f}, {rf[2]:.3f}"] for x, rf in rows if rf]
    top = ", ".join(f"{t['merged']} {t['gain']}" for t in r["top_subwords"][:8])
    topc = ", ".join(f"{t['merged']} {t['count']}" for t in r.get("top_subwords_count", [])[:8])
    return (["The tutorial's rule (appendix E) merges the pair with the largest raw count (*count*); its rows and "
             "ours under that rule. The tutorial's vocabulary column matches our *tokens in use*.", ""]
            + kit.table(HEADER + ["reference (vocab, mean, ΣT²)"], like)
            + ["", "The training corpus: DeepChem 2.8's scaffold split gives other training molecules than the "
               "tutorial's.", ""] + kit.table(["", "ours", "tutorial"], _corpus_rows(r))
            + ["", f"Top subwords by gain: {top}" + (f"; by count: {topc}" if topc else "") + "."])


def _extras(r):
    gain = [_row(x) for x in r["schemes"] if not _ref(x)]
    ex = r["examples"]
    form = {"caffeine": "aromatic", "caffeine_kekule": "Kekulé, the tutorial's notation"}
    return (["Our rule (*gain*) merges the pair with the largest measured non-overlapping gain and skips a pair "
             "whose merge would recreate an existing symbol:", ""] + kit.table(HEADER, gain)
            + ["", "Caffeine at BPE@512:", ""]
            + [f"- `{e['smiles']}` ({form.get(k, k)}) → " + " / ".join(e["bpe512"]) + f" ({e['n_bpe512']} tokens, "
               f"{e['n_atom']} atom-level tokens)" for k, e in ex.items() if k.startswith("caffeine")])


def reading(r):
    """The tokenization reading: what 512 merges buy (beside the tutorial's), the count rule against the
    tutorial's table, atoms cut by BPE, the corpus difference."""
    by = {x["scheme"]: x for x in r["schemes"]}
    c, b, RT = by.get("char"), by.get("BPE@512"), TOKENIZATION_REF
    out = []
    if c and b:
        out.append(f"512 merges shorten the average molecule {c['mean_tokens'] / b['mean_tokens']:.1f}× and Σ T² "
                   f"{1 / b['sum_T2_rel_char']:.0f}× (tutorial {RT['char'][1] / RT['BPE@512'][1]:.1f}× and "
                   f"{1 / RT['BPE@512'][2]:.0f}×): the attention cost falls with the square of the length.")
    gaps = [(abs(x["mean_tokens"] - rf[1]), x["scheme"]) for x, rf in ((x, _ref(x)) for x in r["schemes"]) if rf]
    if gaps:
        gap, where = max(gaps)
        out.append(f"Under the tutorial's count rule our mean tokens per molecule are within {gap:.2f} of its table "
                   f"(largest gap at {where}): " + (f"its table is reproduced (within {REPRODUCE_TOKENS})."
                                                     if gap <= REPRODUCE_TOKENS else "NOT reproduced."))
    if b and b.get("molecules_with_cut_atoms"):
        out.append(f"{b['molecules_with_cut_atoms']} molecules have a token boundary inside an atom at BPE@512 (e.g. "
                   "`l)` from `Cl)`): character BPE does not know chemistry.")
    return out


def page(payload):
    """The tokenization page parts (report_kit.Page)."""
    r = payload["results"]
    return kit.Page(_comparison(r), reading(r), DIFFERENCES, _extras(r), ["tokenization_lengths"])


def headline(r):
    """The overview row: mean tokens per SMILES, characters and BPE@512."""
    s = {x["scheme"]: x for x in r["schemes"]}
    ref = TOKENIZATION_REF
    return (f"mean tokens per SMILES: char {s['char']['mean_tokens']:.2f}, BPE@512 {s['BPE@512']['mean_tokens']:.2f}",
            f"{ref['char'][1]:.2f}, {ref['BPE@512'][1]:.2f}")
