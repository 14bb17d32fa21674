"""Lattice workloads: LatticeLSTM and LatticeGRU over character lattices.

Data: dynagraph.datasets.synthetic_lattices. A lattice of n nodes is a chain of
n - 1 character arcs (node i-1 -> i) plus word arcs spanning 2 to 8 characters
(i - span -> i); at each node a word arc ends with probability `word_rate`
(0.5), and each further distinct span with probability word_rate / 4 (at most
four per node). Lengths are uniform in [min_len, max_len] (5..40 here); token
ids are Zipf-like for characters, uniform for words; tags uniform.

Model: every arc runs a recurrent cell on its source node's state and its token
embedding; character arcs and word arcs have separate cells (separate
parameters, and separate embedding tables). A node's state is the sum of its
incoming arc cells' states (h and c for the LSTM, h for the GRU); node 0, the
start, holds a learned initial state. Every node i >= 1 has a loss: softmax
cross-entropy of an affine map of its h against its tag.
"""
from __future__ import annotations

import random

import dynagraph as dy
from dynagraph.datasets import read_lattices, shared_data_path, synthetic_lattices

from .base import Workload, gru_cell, gru_params, lstm_cell

CHARS, WORDS, TAGS = 500, 2000, 10
MIN_LEN, MAX_LEN = 5, 40


def _sum(xs: list):
    return xs[0] if len(xs) == 1 else dy.esum(xs)


class _Lattice(Workload):
    kind = "lattice"

    def _build(self, pc, hidden):
        self.C = pc.add_lookup_parameters((CHARS, hidden), name="C")
        self.Wd = pc.add_lookup_parameters((WORDS, hidden), name="Wd")
        self.W_out = pc.add_parameters((TAGS, hidden), name="W_out")
        self.b_out = pc.add_parameters((TAGS,), init=dy.ConstInitializer(0.0), name="b_out")
        self._build_cells(pc, hidden)

    def instances(self, n: int, seed: int = 1) -> list:
        return synthetic_lattices(n, min_len=MIN_LEN, max_len=MAX_LEN, char_vocab=CHARS, word_vocab=WORDS,
                                  n_tags=TAGS, seed=seed)

    def loss(self, lat):
        states = [self.start()]
        losses = []
        for i in range(1, lat.n):
            cells = []
            for frm, tok, is_char in lat.arcs[i]:
                x = dy.lookup(self.C if is_char else self.Wd, tok)
                cells.append(self.cell(is_char, x, states[frm]))
            states.append(self.combine(cells))
            h = states[-1][0]
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([self.b_out, self.W_out, h]), lat.tags[i]))
        return dy.esum(losses)


class LatticeLSTM(_Lattice):
    name = "latticelstm"

    def _build_cells(self, pc, h):
        zero = dy.ConstInitializer(0.0)
        self.h0 = pc.add_parameters((h,), init=zero, name="h0")
        self.c0 = pc.add_parameters((h,), init=zero, name="c0")
        self.cells = {flag: (pc.add_parameters((4 * h,), init=zero, name=f"b_{tag}"),
                             pc.add_parameters((4 * h, h), name=f"Wx_{tag}"),
                             pc.add_parameters((4 * h, h), name=f"Wh_{tag}"))
                      for flag, tag in ((True, "char"), (False, "word"))}

    def start(self):
        return dy.parameter(self.h0), dy.parameter(self.c0)

    def cell(self, is_char, x, state):
        b, Wx, Wh = self.cells[is_char]
        return lstm_cell(b, Wx, x, Wh, state[0], state[1], self.hidden)

    def combine(self, cells):
        return _sum([h for h, _ in cells]), _sum([c for _, c in cells])


class LatticeGRU(_Lattice):
    name = "latticegru"

    def _build_cells(self, pc, h):
        self.h0 = pc.add_parameters((h,), init=dy.ConstInitializer(0.0), name="h0")
        self.cells = {True: gru_params(pc, h, h, "char"), False: gru_params(pc, h, h, "word")}

    def start(self):
        return (dy.parameter(self.h0),)

    def cell(self, is_char, x, state):
        return (gru_cell(self.cells[is_char], x, state[0]),)

    def combine(self, cells):
        return (_sum([h for (h,) in cells]),)


class NERLattice(_Lattice):
    """The lattice tagger over the real Chinese-NER character lattices (shared/data/lattice).

    An LSTM cell per character arc and a gated word cell per lexicon arc (input and
    forget gates over a candidate cell, no output gate: Zhang & Yang's word cell);
    a node sums its arcs' (h, c). Falls back to synthetic lattices of the same shape
    when the data file is absent. Vocabulary sizes cover the real ids.
    """
    name = "nerlattice"
    chars, words, tags = 5000, 12000, 20

    def _build(self, pc, hidden):
        self.C = pc.add_lookup_parameters((self.chars, hidden), name="C")
        self.Wd = pc.add_lookup_parameters((self.words, hidden), name="Wd")
        self.W_out = pc.add_parameters((self.tags, hidden), name="W_out")
        self.b_out = pc.add_parameters((self.tags,), init=dy.ConstInitializer(0.0), name="b_out")
        zero = dy.ConstInitializer(0.0)
        self.h0 = pc.add_parameters((hidden,), init=zero, name="h0")
        self.c0 = pc.add_parameters((hidden,), init=zero, name="c0")
        self.char_cell = (pc.add_parameters((4 * hidden,), init=zero, name="b_char"),
                          pc.add_parameters((4 * hidden, hidden), name="Wx_char"),
                          pc.add_parameters((4 * hidden, hidden), name="Wh_char"))
        self.word_cell = (pc.add_parameters((3 * hidden,), init=zero, name="b_word"),
                          pc.add_parameters((3 * hidden, hidden), name="Wx_word"),
                          pc.add_parameters((3 * hidden, hidden), name="Wh_word"))

    def instances(self, n: int, seed: int = 1) -> list:
        data = _ner_lattices()
        if not data:
            return synthetic_lattices(n, min_len=MIN_LEN, max_len=MAX_LEN, char_vocab=self.chars,
                                      word_vocab=self.words, n_tags=self.tags, seed=seed)
        rng = random.Random(seed)
        return rng.sample(data, min(n, len(data)))

    def start(self):
        return dy.parameter(self.h0), dy.parameter(self.c0)

    def cell(self, is_char, x, state):
        h = self.hidden
        if is_char:
            b, Wx, Wh = self.char_cell
            return lstm_cell(b, Wx, x, Wh, state[0], state[1], h)
        b, Wx, Wh = self.word_cell
        g = dy.affine_transform([b, Wx, x, Wh, state[0]])
        i = dy.logistic(dy.pick_range(g, 0, h))
        f = dy.logistic(dy.pick_range(g, h, 2 * h))
        u = dy.tanh(dy.pick_range(g, 2 * h, 3 * h))
        c = dy.cmult(i, u) + dy.cmult(f, state[1])
        return dy.tanh(c), c

    def combine(self, cells):
        return _sum([h for h, _ in cells]), _sum([c for _, c in cells])


_NER_CACHE: list = []


def _ner_lattices() -> list:
    """The real lattices whose ids fit NERLattice's tables (read once), or [] without the file."""
    path = shared_data_path("lattice", "train.txt")
    if not _NER_CACHE and path:
        lim = NERLattice
        _NER_CACHE.extend(lat for lat in read_lattices(path)
                          if max(lat.tags) < lim.tags and all(
                              tok < (lim.chars if is_char else lim.words)
                              for arcs in lat.arcs for _, tok, is_char in arcs))
    return _NER_CACHE
