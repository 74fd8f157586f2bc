"""The MOSES benchmark molecules (experiment 10, the data-hunger study): reading, nested subsets, vocabularies.

Standard library only (gzip, csv, random); it imports ``chemdata`` (the data folder, the tokenizer, Vocab) and
nothing else of the project.

Files
-----
``moses/train.csv.gz`` (1,584,663 SMILES) and ``moses/test.csv.gz`` (176,074) in the data folder
(``$CHEMDATA_DIR``, else ``data/``): one column, header ``SMILES``.  ``chemdata.DATA_FILES`` holds their sha256
and where they come from: the folder ``moses/dataset/data/`` of the ``molsets`` 0.3.1 wheel (MIT), which
``python chemdata.py fetch`` downloads with ``pip download --no-deps`` and opens with ``zipfile`` (molsets is
never installed).  A file that is cut short or not gzip gives one ``MosesFileError`` naming it.

Subsets (``nested_subsets``)
----------------------------
One shuffle of the training file with ``random.Random(SHUFFLE_SEED)``; training subset N = its first N
molecules (N in SIZES), so every larger subset holds every smaller one; validation = the N_VALID molecules that
follow the largest subset (positions 100,000-101,999: in no training subset, the same for every size and every
run mode); test = ``random.Random(TEST_SEED).sample`` of N_TEST molecules of the test file.

Unknown tokens (``size_vocab``)
-------------------------------
Each size has its own vocabulary: every token of its training subset (``chemdata.Vocab.build``: descending
frequency, ties alphabetical) after the 4 specials.  A validation or test token that the subset never showed
is encoded as ``<unk>`` and scored as that id by both models alike (the n-gram's unigram floor and the
Transformer's softmax both give ``<unk>`` a probability; neither saw it as a target in training).  A model
cannot know a symbol its data never held, so this is the honest treatment at small N; ``vocab_record`` states
how many test tokens it touches per size.
"""
import csv
import gzip
import random
import zlib

import chemdata

TRAIN_FILE, TEST_FILE = "moses/train.csv.gz", "moses/test.csv.gz"
SIZES = (1000, 3000, 10000, 30000, 100000)
N_VALID = 2000
N_TEST = 10000
SHUFFLE_SEED = 0
TEST_SEED = 1


class MosesFileError(chemdata.DatasetFormatError):
    """A MOSES file that cannot be read as a gzipped one-column SMILES CSV (truncated, corrupt, wrong header);
    ``path`` names it."""

    def __init__(self, path, why):
        self.path = path
        super().__init__(f"MOSES file {path} is unreadable: {why}.  Replace it (python chemdata.py fetch, or a "
                         "fresh copy; data/README.md gives its sha256)")


def read_smiles(path):
    """The SMILES of one MOSES file, in file order (header ``SMILES`` required, blank rows refused)."""
    try:
        with gzip.open(path, "rt", encoding="ascii", newline="") as f:
            rows = csv.reader(f)
            header = next(rows, None)
            if header != ["SMILES"]:
                raise MosesFileError(path, f"its header is {header!r}, expected ['SMILES']")
            out = [r[0] for r in rows if len(r) == 1 and r[0]]
    except (EOFError, OSError, zlib.error, UnicodeDecodeError, csv.Error) as exc:
        raise MosesFileError(path, f"{type(exc).__name__}: {exc} (truncated or corrupt)") from None
    if not out:
        raise MosesFileError(path, "it holds no SMILES")
    return out


def load_moses(split, download=None):
    """``"train"`` or ``"test"``: the file's SMILES (found, or fetched, by ``chemdata.data_path``)."""
    if split not in ("train", "test"):
        raise ValueError(f"load_moses: split must be 'train' or 'test', got {split!r}")
    return read_smiles(chemdata.data_path(TRAIN_FILE if split == "train" else TEST_FILE, download))


def nested_subsets(train, test, sizes=SIZES, n_valid=N_VALID, n_test=N_TEST, valid_at=None):
    """{"train": {N: first N of the shuffle}, "valid": n_valid molecules after position ``valid_at`` (default
    max(SIZES), whatever ``sizes`` is, so that a run on fewer sizes validates on the same molecules), "test":
    n_test sampled from ``test``, "order_head": the first 5 shuffled indices (a fingerprint of the shuffle)}."""
    valid_at = max(SIZES) if valid_at is None else valid_at
    if max(sizes) > valid_at or valid_at + n_valid > len(train) or n_test > len(test):
        raise ValueError(f"nested_subsets: sizes {sizes} / {n_valid} validation / {n_test} test do not fit "
                         f"{len(train)} training and {len(test)} test molecules")
    order = list(range(len(train)))
    random.Random(SHUFFLE_SEED).shuffle(order)
    return {"train": {n: [train[i] for i in order[:n]] for n in sizes},
            "valid": [train[i] for i in order[valid_at:valid_at + n_valid]],
            "test": random.Random(TEST_SEED).sample(test, n_test), "order_head": order[:5]}


def size_vocab(train_tokens):
    """The vocabulary of one size: every token of its training subset (``chemdata.Vocab.build``)."""
    return chemdata.Vocab.build(train_tokens)


def unknown_share(vocab, token_lists):
    """(unknown tokens, all tokens, molecules with one or more) of token lists against a vocabulary."""
    unk = [sum(t not in vocab.stoi for t in toks) for toks in token_lists]
    return sum(unk), sum(len(t) for t in token_lists), sum(1 for u in unk if u)


def vocab_record(vocab, test_tokens):
    """What a size's vocabulary holds and how much of the test split falls outside it."""
    unk, total, mols = unknown_share(vocab, test_tokens)
    unseen = sorted({t for toks in test_tokens for t in toks if t not in vocab.stoi})
    return {"size": len(vocab), "tokens": vocab.itos[len(chemdata.Vocab.SPECIALS):], "test_unknown_tokens": unk,
            "test_tokens": total, "test_unknown_share": unk / total, "test_molecules_with_unknown": mols,
            "test_symbols_unseen": unseen}
