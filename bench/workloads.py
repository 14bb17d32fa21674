"""Benchmark workloads: deterministic data as plain integer structures.

Every system (dynagraph, DyNet, PyTorch, hand-batched numpy) reads the same
samples, so this module must not import any of them. Trees are flattened to
post-order arrays once, outside the timed region, because every system would
otherwise pay a different price for walking `datasets.Tree` objects.

Generators (all from `dynagraph.datasets`, which is plain numpy):

* ``treelstm``      `synthetic_trees(n, vocab_size=10000, seed)`: lengths 1..54 (mean ~19,
                    Gamma-shaped), random bracketing, Zipf words, 5 root labels.
* ``treelstm-sst``  the real SST training trees (../shared/data/sst/train.txt), shuffled
                    with `seed`; vocabulary = every training word. Only when the file exists.
* ``treefc64/256``  `complete_tree(n_leaves, vocab_size=10000, seed=seed*1000003+i)`:
                    a perfectly balanced tree per sample, random words and root label.
* ``bilstm``        `synthetic_tagging(n, min_len=5, max_len=50, vocab_size=10000, n_tags=20)`.
* ``mvrnn``         `synthetic_trees(n, vocab_size=1000, seed)`: a per-word H x H matrix over a
                    10k vocabulary would be 164 MB per process at H=64, so MV-RNN uses 1k words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from dynagraph import datasets


class FlatTree(NamedTuple):
    """A binary tree in post-order: node k is a leaf iff left[k] < 0; the root is last."""
    words: list    # word id per node (-1 for internal nodes)
    left: list     # index of the left child, -1 for leaves
    right: list
    label: int     # root label (the loss is at the root)


class Tagged(NamedTuple):
    words: list
    tags: list


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str                      # model: treelstm | treefc | bilstm | mvrnn
    vocab: int                     # rows of the embedding table (set for sst at load time)
    n_out: int                     # classes or tags
    make: Callable[[int, int], list]  # (n samples, seed) -> samples
    fixed_H: int | None = None     # the model's own hidden size (MV-RNN)
    available: Callable[[], bool] = lambda: True


def flatten(tree: datasets.Tree, word_id: Callable[[str], int]) -> FlatTree:
    """Post-order arrays. Unary nodes pass their child through; n-ary nodes fold left."""
    words, left, right, at = [], [], [], {}
    for node in tree.nodes_postorder():
        if node.is_leaf():
            at[id(node)] = len(words)
            words.append(word_id(node.word))
            left.append(-1)
            right.append(-1)
            continue
        kids = [at[id(c)] for c in node.children]
        acc = kids[0]
        for k in kids[1:]:
            words.append(-1)
            left.append(acc)
            right.append(k)
            acc = len(words) - 1
        at[id(node)] = acc
    return FlatTree(words, left, right, tree.label)


def _synthetic_id(vocab: int) -> Callable[[str], int]:
    return lambda w: int(w[1:]) % vocab  # generator words are "w<id>"


def _trees(n: int, seed: int, vocab: int = 10000) -> list:
    ids = _synthetic_id(vocab)
    return [flatten(t, ids) for t in datasets.synthetic_trees(n, vocab_size=vocab, seed=seed)]


def _complete(n_leaves: int) -> Callable[[int, int], list]:
    def make(n: int, seed: int) -> list:
        ids = _synthetic_id(10000)
        return [flatten(datasets.complete_tree(n_leaves, vocab_size=10000, seed=seed * 1000003 + i), ids)
                for i in range(n)]
    return make


def _tagging(n: int, seed: int) -> list:
    sents = datasets.synthetic_tagging(n, min_len=5, max_len=50, vocab_size=10000, n_tags=20, seed=seed)
    return [Tagged([int(w[1:]) for w, _ in s], [int(t[1:]) for _, t in s]) for s in sents]


_SST: dict = {}


def _sst_trees() -> tuple[list, int]:
    """Parsed once per process: (trees in file order, vocabulary size)."""
    if "trees" not in _SST:
        trees = datasets.read_sst(datasets.shared_data_path("sst", "train.txt"))
        vocab = datasets.Vocab.build(w for t in trees for w in t.words())
        _SST["trees"] = [flatten(t, vocab.__getitem__) for t in trees]
        _SST["vocab"] = len(vocab)
    return _SST["trees"], _SST["vocab"]


def _sst(n: int, seed: int) -> list:
    import numpy as np
    trees, _ = _sst_trees()
    order = np.random.default_rng(seed).permutation(len(trees))  # the file is grouped by label
    return [trees[i] for i in order[:n]]


def _has_sst() -> bool:
    return datasets.shared_data_path("sst", "train.txt") is not None


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("treelstm", "treelstm", 10000, 5, _trees),
    Workload("treelstm-sst", "treelstm", 0, 5, _sst, available=_has_sst),
    Workload("treefc64", "treefc", 10000, 5, _complete(64)),
    Workload("treefc256", "treefc", 10000, 5, _complete(256)),
    Workload("bilstm", "bilstm", 10000, 20, _tagging),
    Workload("mvrnn", "mvrnn", 1000, 5, lambda n, seed: _trees(n, seed, vocab=1000), fixed_H=64),
]}


def vocab_size(w: Workload) -> int:
    return _sst_trees()[1] if w.name == "treelstm-sst" else w.vocab


def load(name: str, n: int, seed: int) -> tuple[list, int]:
    """(samples, vocabulary size) for a workload."""
    w = WORKLOADS[name]
    return w.make(n, seed), vocab_size(w)


def minibatches(samples: list, batch_size: int) -> list:
    return [samples[i:i + batch_size] for i in range(0, len(samples), batch_size)]
