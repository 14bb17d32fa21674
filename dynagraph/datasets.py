"""Readers for the benchmark data sets and synthetic look-alikes.

Three workloads from the dynamic-batching literature:

* SST sentiment trees (TreeLSTM): `parse_tree`, `read_sst`, `synthetic_trees`, `complete_tree`.
* WikiNER tagging (BiLSTM tagger): `read_wikiner`, `synthetic_tagging`.
* Chinese NER character lattices (Lattice-LSTM): `Lattice`, `read_lattices`, `synthetic_lattices`.

Real files live in ``../shared/data`` (see `shared_data_path`); every reader has a
synthetic generator with the same output type so code runs without the data.
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Iterable, Iterator

import numpy as np

__all__ = [
    "Tree", "parse_tree", "read_sst", "synthetic_trees", "complete_tree",
    "read_wikiner", "synthetic_tagging",
    "Lattice", "read_lattices", "synthetic_lattices",
    "Vocab", "shared_data_path",
]


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------

class Tree:
    """A labelled constituency tree node; a leaf iff `word` is not None."""

    __slots__ = ("label", "children", "word")

    def __init__(self, label: int, children: list[Tree] | None = None, word: str | None = None):
        self.label = int(label)
        self.children: list[Tree] = list(children) if children else []
        self.word = word

    def is_leaf(self) -> bool:
        return self.word is not None

    def leaves(self) -> list[Tree]:
        return [n for n in self.nodes_postorder() if n.is_leaf()]

    def nodes_postorder(self) -> list[Tree]:
        # Iterative so that deep (left-branching) trees do not hit the recursion limit.
        out: list[Tree] = []
        stack: list[tuple[Tree, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded or node.is_leaf():
                out.append(node)
            else:
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.children))
        return out

    def height(self) -> int:
        """Number of edges on the longest root-to-leaf path (a leaf has height 0)."""
        h: dict[int, int] = {}
        for n in self.nodes_postorder():
            h[id(n)] = 0 if n.is_leaf() else 1 + max(h[id(c)] for c in n.children)
        return h[id(self)]

    def words(self) -> list[str]:
        return [leaf.word for leaf in self.leaves()]  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self.leaves())

    def __str__(self) -> str:
        if self.is_leaf():
            return f"({self.label} {_escape(self.word)})"  # type: ignore[arg-type]
        return f"({self.label} {' '.join(str(c) for c in self.children)})"

    def __repr__(self) -> str:
        return f"Tree({self})"


_UNESCAPE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}
_ESCAPE = {v: k for k, v in _UNESCAPE.items()}


def _unescape(tok: str) -> str:
    return _UNESCAPE.get(tok, tok).replace("\\/", "/").replace("\\*", "*")


def _escape(word: str) -> str:
    return _ESCAPE.get(word, word.replace("/", "\\/"))


def _tokenize(line: str) -> Iterator[str]:
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in "()":
            yield c
            i += 1
        elif c.isspace():
            i += 1
        else:
            j = i
            while j < n and line[j] not in "() \t\r\n":
                j += 1
            yield line[i:j]
            i = j


def parse_tree(line: str) -> Tree:
    """Parse one PTB bracketed tree, e.g. ``(3 (2 An) (3 (4 imaginative) (2 .)))``.

    A node is ``(label word)`` (leaf) or ``(label child ...)``. Words are unescaped
    (``-LRB-`` -> ``(``, ``-RRB-`` -> ``)``, ``\\/`` -> ``/``).
    """
    toks = list(_tokenize(line))
    if not toks:
        raise ValueError("empty tree string")
    stack: list[Tree] = []
    root: Tree | None = None
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "(":
            if i + 1 >= len(toks) or toks[i + 1] in "()":
                raise ValueError(f"missing label at token {i} in {line!r}")
            node = Tree(_parse_label(toks[i + 1], line))
            if stack:
                if stack[-1].word is not None:
                    raise ValueError(f"node with both a word and children in {line!r}")
                stack[-1].children.append(node)
            elif root is not None:
                raise ValueError(f"more than one tree in {line!r}")
            else:
                root = node
            stack.append(node)
            i += 2
        elif t == ")":
            if not stack:
                raise ValueError(f"unbalanced ')' in {line!r}")
            node = stack.pop()
            if node.word is None and not node.children:
                raise ValueError(f"empty node in {line!r}")
            i += 1
        else:
            if not stack or stack[-1].children or stack[-1].word is not None:
                raise ValueError(f"unexpected word {t!r} in {line!r}")
            stack[-1].word = _unescape(t)
            i += 1
    if stack or root is None:
        raise ValueError(f"unbalanced '(' in {line!r}")
    return root


def _parse_label(tok: str, line: str) -> int:
    try:
        return int(tok)
    except ValueError:
        raise ValueError(f"non-integer label {tok!r} in {line!r}") from None


def read_sst(path: str) -> list[Tree]:
    """Read an SST file: one PTB tree per non-empty line."""
    with open(path, encoding="utf-8") as f:
        return [parse_tree(line) for line in f if line.strip()]


def _random_binary_tree(words: list[str], labels: np.ndarray, rng: np.random.Generator) -> Tree:
    """Random bracketing: repeatedly merge a uniformly chosen adjacent pair.

    This is the "random merge" process; it produces a mix of balanced and skewed
    trees similar in depth to parser output (height ~ O(log n) on average).
    """
    nodes = [Tree(int(labels[i]), word=w) for i, w in enumerate(words)]
    k = len(words)
    while len(nodes) > 1:
        j = int(rng.integers(len(nodes) - 1))
        nodes[j:j + 2] = [Tree(int(labels[k]), [nodes[j], nodes[j + 1]])]
        k += 1
    return nodes[0]


def synthetic_trees(n: int, vocab_size: int = 10000, min_len: int = 1, max_len: int = 54,
                    mean_len: int = 19, n_labels: int = 5, seed: int = 0) -> list[Tree]:
    """SST-like random binary trees.

    * Length (number of leaves): ``min_len + round(Gamma(shape=4, scale=(mean_len - min_len) / 4))``
      clipped to ``[min_len, max_len]``: mean ~``mean_len``, std ~half of it, right-skewed
      (SST train: 2-52 words, mean 19.1, std 9.3, median 18).
    * Bracketing: start from the leaf sequence and merge a uniformly random adjacent
      pair into a new internal node until one root remains (every binary bracketing
      is reachable; depths resemble parser output).
    * Words ``"w<id>"`` with ids drawn from a Zipf-like law over ``vocab_size`` words
      (so frequent words repeat, as in text); labels are uniform in ``[0, n_labels)``.
    Deterministic given ``seed``.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError("need 1 <= min_len <= max_len")
    rng = np.random.default_rng(seed)
    scale = max(mean_len - min_len, 0) / 4.0
    out = []
    for _ in range(n):
        length = int(np.clip(min_len + round(rng.gamma(4.0, scale)), min_len, max_len))
        ids = _zipf_ids(rng, length, vocab_size)
        labels = rng.integers(n_labels, size=2 * length - 1)
        out.append(_random_binary_tree([f"w{i}" for i in ids], labels, rng))
    return out


def complete_tree(n_leaves: int, vocab_size: int = 10000, n_labels: int = 5, seed: int = 0) -> Tree:
    """A perfectly balanced binary tree with ``n_leaves`` (a power of 2) leaves."""
    if n_leaves < 1 or n_leaves & (n_leaves - 1):
        raise ValueError(f"n_leaves must be a power of 2, got {n_leaves}")
    rng = np.random.default_rng(seed)
    level = [Tree(int(rng.integers(n_labels)), word=f"w{int(rng.integers(vocab_size))}")
             for _ in range(n_leaves)]
    while len(level) > 1:
        level = [Tree(int(rng.integers(n_labels)), [level[i], level[i + 1]])
                 for i in range(0, len(level), 2)]
    return level[0]


def _zipf_ids(rng: np.random.Generator, size: int, vocab_size: int) -> np.ndarray:
    # Zipf(1.2) truncated to the vocabulary by folding; cheap and heavy-tailed.
    return (rng.zipf(1.2, size=size) - 1) % vocab_size


# ---------------------------------------------------------------------------
# Tagging
# ---------------------------------------------------------------------------

def read_wikiner(path: str) -> list[list[tuple[str, str]]]:
    """Read WikiNER: one sentence per line of space-separated ``word|TAG`` tokens.

    The tag is taken after the last ``|`` so that words containing ``|`` survive.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            toks = line.split()
            if not toks:
                continue
            sent = []
            for tok in toks:
                word, bar, tag = tok.rpartition("|")
                if not bar or not word or not tag:
                    raise ValueError(f"{path}:{lineno}: bad token {tok!r} (expected word|TAG)")
                sent.append((word, tag))
            out.append(sent)
    return out


def synthetic_tagging(n: int, min_len: int = 5, max_len: int = 50, vocab_size: int = 10000,
                      n_tags: int = 20, seed: int = 0) -> list[list[tuple[str, str]]]:
    """Synthetic tagged sentences with a learnable word -> tag relation.

    Lengths are uniform in ``[min_len, max_len]``; words ``"w<id>"`` are Zipf-distributed.
    Each word has a fixed "home" tag (``id % n_tags``, tag ``"T<k>"``); with probability
    0.2 the tag is instead that of the previous word, so context helps a BiLSTM.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        ids = _zipf_ids(rng, length, vocab_size)
        copy = rng.random(length) < 0.2
        sent = []
        for i, w in enumerate(ids):
            src = ids[i - 1] if i > 0 and copy[i] else w
            sent.append((f"w{w}", f"T{src % n_tags}"))
        out.append(sent)
    return out


# ---------------------------------------------------------------------------
# Lattices
# ---------------------------------------------------------------------------

class Lattice:
    """A character lattice: ``n`` nodes, a tag per node, incoming arcs per node.

    ``arcs[i]`` lists ``(from_node, token_id, is_char)``: a character arc comes from
    ``i - 1`` and ``token_id`` indexes the character vocabulary; any other arc is a
    lexicon word spanning ``from_node..i`` and indexes the word vocabulary.
    Node 0 is the start node and has no incoming arcs.
    """

    __slots__ = ("n", "tags", "arcs")

    def __init__(self, n: int, tags: list[int], arcs: list[list[tuple[int, int, bool]]]):
        if len(tags) != n or len(arcs) != n:
            raise ValueError(f"lattice of {n} nodes has {len(tags)} tags and {len(arcs)} arc lists")
        self.n, self.tags, self.arcs = n, list(tags), arcs

    def char_arcs(self) -> list[tuple[int, int, bool]]:
        return [a for arcs in self.arcs for a in arcs if a[2]]

    def word_arcs(self) -> list[tuple[int, int, bool]]:
        return [a for arcs in self.arcs for a in arcs if not a[2]]

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Lattice(n={self.n}, chars={len(self.char_arcs())}, words={len(self.word_arcs())})"


def _parse_arcs(line: str, node: int) -> list[tuple[int, int, bool]]:
    vals = [int(v) for v in line.split()]
    if not vals or len(vals) != 1 + 2 * vals[0]:
        raise ValueError(f"node {node}: bad arc line {line!r}")
    arcs = []
    for j in range(vals[0]):
        frm, tok = vals[1 + 2 * j], vals[2 + 2 * j]
        if not 0 <= frm < node:
            raise ValueError(f"node {node}: arc from {frm} does not point backwards")
        arcs.append((frm, tok, frm == node - 1))
    return arcs


def parse_lattices(lines: Iterable[str]) -> list[Lattice]:
    """Parse the lattice format (see `read_lattices`) from an iterable of lines."""
    it = (ln for ln in lines if ln.strip())
    count = int(next(it))
    out = []
    for _ in range(count):
        n = int(next(it))
        tags = [int(v) for v in next(it).split()]
        # Node 0's line is "0" (no arcs); blank-only lines were skipped above, so
        # a node line always has at least its arc count.
        arcs = [_parse_arcs(next(it), i) for i in range(n)]
        out.append(Lattice(n, tags, arcs))
    return out


def read_lattices(path: str) -> list[Lattice]:
    """Read a lattice file.

    Line 1: number of lattices. Per lattice: its length n; n tag ids; then n node
    lines ``k (from_id token_id)*k``. An arc from node i-1 is a character arc.
    """
    with open(path, encoding="utf-8") as f:
        return parse_lattices(f)


def synthetic_lattices(n: int, min_len: int = 5, max_len: int = 60, char_vocab: int = 3000,
                       word_vocab: int = 10000, n_tags: int = 10, word_rate: float = 0.5,
                       seed: int = 0) -> list[Lattice]:
    """Synthetic character lattices shaped like the Chinese-NER data.

    * ``n_nodes`` uniform in ``[min_len, max_len]``; node 0 is the start node (no arcs,
      tag 0), every other node gets one character arc from the previous node.
    * Word arcs: at each node ``i``, with probability ``word_rate`` add one word arc
      from ``i - span`` with ``span`` uniform in 2..8 (clipped so ``i - span >= 0``);
      each further span is added with probability ``word_rate / 4`` (multi-word nodes
      occur, as in real lexicon matches).
    * Token ids: characters Zipf over ``char_vocab``, words uniform over ``word_vocab``;
      tags uniform in ``[0, n_tags)``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = int(rng.integers(min_len, max_len + 1))
        arcs: list[list[tuple[int, int, bool]]] = [[]]
        chars = _zipf_ids(rng, m, char_vocab)
        for i in range(1, m):
            node = [(i - 1, int(chars[i]), True)]
            for span in _word_spans(rng, i, word_rate):
                node.append((i - span, int(rng.integers(word_vocab)), False))
            arcs.append(node)
        tags = [0] + [int(t) for t in rng.integers(n_tags, size=m - 1)]
        out.append(Lattice(m, tags, arcs))
    return out


def _word_spans(rng: np.random.Generator, i: int, rate: float) -> list[int]:
    if i < 2:
        return []
    spans: list[int] = []
    p = rate
    while rng.random() < p and len(spans) < 4:
        s = int(rng.integers(2, min(8, i) + 1))
        if s not in spans:
            spans.append(s)
        p = rate / 4
    return spans


# ---------------------------------------------------------------------------
# Vocabulary and data location
# ---------------------------------------------------------------------------

class Vocab:
    """Word -> id map with a reserved UNK id (0 by default).

    ``Vocab.build(words, min_count)`` counts words; ids are assigned by decreasing
    frequency (ties broken by first occurrence) so runs are deterministic.
    """

    def __init__(self, words: Iterable[str] = (), unk: str = "<unk>"):
        self.unk = unk
        self.i2w: list[str] = [unk]
        self.w2i: dict[str, int] = {unk: 0}
        for w in words:
            self.add(w)

    @classmethod
    def build(cls, words: Iterable[str], min_count: int = 1, unk: str = "<unk>") -> Vocab:
        counts = Counter(words)
        kept = sorted((w for w, c in counts.items() if c >= min_count and w != unk),
                      key=lambda w: -counts[w])  # sorted() is stable: ties keep first occurrence
        return cls(kept, unk=unk)

    @property
    def unk_id(self) -> int:
        return self.w2i[self.unk]

    def add(self, word: str) -> int:
        if word not in self.w2i:
            self.w2i[word] = len(self.i2w)
            self.i2w.append(word)
        return self.w2i[word]

    def __len__(self) -> int:
        return len(self.i2w)

    def __getitem__(self, word: str) -> int:
        return self.w2i.get(word, self.w2i[self.unk])

    def __contains__(self, word: str) -> bool:
        return word in self.w2i

    def word(self, i: int) -> str:
        return self.i2w[i]


def shared_data_path(*parts: str) -> str | None:
    """Path of ``../shared/data/<parts>`` (or ``$DYNAGRAPH_DATA/<parts>``), None if absent."""
    env = os.environ.get("DYNAGRAPH_DATA")
    if env:
        roots = [env]
    else:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        roots = [os.path.join(repo, "..", "shared", "data")]
    for root in roots:
        path = os.path.normpath(os.path.join(root, *parts))
        if os.path.exists(path):
            return path
    return None
