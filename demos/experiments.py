"""The studies of the tutorial, one row each, in its order: the only list of them in the project.

    import experiments
    for e in experiments.EXPERIMENTS:
        print(e.script, e.results, e.page, e.title)

Each row says where a study lives:

script    demos/demo_<script>.py, the study's experiment; demos/report_<script>.py, its report (figures,
          tables, reading); run_all.py's name for it (``--only``, the summary rows)
results   figures/results_<results>.json, the file the demo writes and the report reads
page      docs/<page>.md, the study's page (written by ``python make_figures.py --readme``); the numbered
          prefix keeps the pages in this order
title     its row in the README's overview table ("All studies at a glance"), linked to its page
heading   its page's title
teaches   what it teaches, for the overview table
part      BLOCKS (experiments 1-3 and the two supplementary studies: the building blocks on synthetic or
          tokenized data, no trained chemistry model) or CHEMISTRY (experiments 4-9, then
          graduate_torch, the study beyond the tutorial that takes experiment 9 to PyTorch, and data_hunger,
          experiment 10 beyond the tutorial: the Transformer / n-gram crossover on MOSES)

run_all.py runs the scripts in this order, make_figures.py writes the overview rows and the pages in it, and
tests/tests_codebase.py checks that every row has a script, a report module, a page linked from the overview and a
QUICK smoke test.  This module imports nothing but the standard library's collections, so anything can
import it.
"""
from collections import namedtuple

Experiment = namedtuple("Experiment", ["script", "results", "page", "title", "heading", "teaches", "part"])
BLOCKS, CHEMISTRY = "building blocks", "chemistry"

EXPERIMENTS = (
    Experiment("attention_basics", "attention", "01-attention", "1 · attention check-up",
               "Experiment 1 — attention check-up",
               "why scores are scaled by 1/√d_k, temperature, the O(T²) cost, every gradient checked", BLOCKS),
    Experiment("positional", "positional", "02-positional", "2 · positional encodings",
               "Experiment 2 — positional encodings",
               "attention is order-blind; sine, learned and RoPE positions and their identities", BLOCKS),
    Experiment("length_generalization", "length_generalization", "03-length-generalization",
               "3 · length extrapolation",
               "Experiment 3 — length extrapolation (trained at length 16)",
               "which position scheme carries a rule to longer sequences than it was trained on", BLOCKS),
    Experiment("smiles_lm", "smiles_lm", "04-smiles-lm", "4 · SMILES language model",
               "Experiment 4 — a SMILES language model on ESOL, and valid generation",
               "next-token modelling of molecules; sampling, validity, and a grammar constraint", CHEMISTRY),
    Experiment("attention_chem", "attention_chem", "05-attention-chem", "5 · what the heads look at",
               "Experiment 5 — what the attention heads look at",
               "reading attention maps: hypotheses, not chemical evidence", CHEMISTRY),
    Experiment("deepchem_esol", "esol", "06-esol", "6 · ESOL solubility",
               "Experiment 6 — ESOL solubility: Transformer vs fingerprints vs the ESOL equation",
               "a small encoder against fingerprints; scaffold vs random split", CHEMISTRY),
    Experiment("deepchem_materials", "materials", "07-materials", "7 · formation energy from composition",
               "Experiment 7 — composition → formation energy (Materials Project)",
               "what composition alone, as a string, cannot tell (negative in the tutorial)", CHEMISTRY),
    Experiment("deepchem_hopv", "hopv", "08-hopv", "8 · HOPV photovoltaics",
               "Experiment 8 — HOPV organic photovoltaics (electrochemical gap)",
               "a Transformer on a few hundred molecules against fingerprints (negative in the tutorial)",
               CHEMISTRY),
    Experiment("reaction_seq2seq", "reaction", "09-reaction", "9 · reaction prediction",
               "Experiment 9 — USPTO-50K product prediction (encoder-decoder, beam search, chemical scoring)",
               "encoder-decoder and beam search on a small slice of USPTO-50K (negative in the tutorial)",
               CHEMISTRY),
    Experiment("graduate_torch", "graduate_torch", "10-graduate-torch", "beyond · graduate to PyTorch",
               "Beyond the tutorial — graduate to PyTorch: experiment 9 on torch's engine, and what scale buys",
               "the same model as a torch module: same losses to 1e-9, the speed-up, and a scale curve",
               CHEMISTRY),
    Experiment("tokenization", "tokenization", "11-tokenization", "tokenization (supplementary)",
               "Supplementary — tokenization of ESOL SMILES",
               "char, atom and BPE tokens: sequence length against vocabulary", BLOCKS),
    Experiment("dropout", "dropout", "12-dropout", "dropout (supplementary)",
               "Supplementary — dropout statistics on a causal attention matrix",
               "inverted dropout is unbiased and how noisy it is", BLOCKS),
    Experiment("data_hunger", "data_hunger", "13-data-hunger", "beyond · data hunger (MOSES)",
               "Beyond the tutorial — data hunger: from how many molecules on does a Transformer beat an n-gram?",
               "the crossover of a Transformer and a tuned n-gram on nested MOSES subsets, 1k to 100k molecules",
               CHEMISTRY),
)


def by_results(name):
    """The row whose results file is results_<name>.json (KeyError when there is none)."""
    for e in EXPERIMENTS:
        if e.results == name:
            return e
    raise KeyError(f"no experiment writes results_{name}.json; known: {', '.join(e.results for e in EXPERIMENTS)}")


def scripts():
    """run_all.py's experiment names (demos/demo_<name>.py), in the tutorial's order."""
    return [e.script for e in EXPERIMENTS]
