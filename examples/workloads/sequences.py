"""Chain workloads: a BiLSTM tagger and an LSTM encoder-decoder.

* BiLSTM tagger: word embeddings -> dy.BiRNNBuilder of VanillaLSTMBuilders ->
  affine -> softmax cross-entropy per token (dynagraph.datasets.synthetic_tagging).
* Encoder-decoder: an LSTM reads the source; a second LSTM, started from the
  encoder's final (c, h), is teacher-forced on the target and scored per token.
  Synthetic pairs: source words Zipf-like over the vocabulary, length uniform in
  [4, 30]; the target is the reversed source, cut to a random length >= 2.
"""
from __future__ import annotations

import numpy as np

import dynagraph as dy
from dynagraph.datasets import synthetic_tagging

from .base import Workload

VOCAB, TAGS = 1000, 9


class BiLSTMTagger(Workload):
    name = "bilstm"
    kind = "chain"

    def _build(self, pc, hidden):
        self.E = pc.add_lookup_parameters((VOCAB, hidden), name="E")
        self.rnn = dy.BiRNNBuilder(1, hidden, 2 * hidden, pc, dy.VanillaLSTMBuilder)
        self.W = pc.add_parameters((TAGS, 2 * hidden), name="W")
        self.b = pc.add_parameters((TAGS,), init=dy.ConstInitializer(0.0), name="b")

    def instances(self, n: int, seed: int = 1) -> list:
        sents = synthetic_tagging(n, min_len=4, max_len=30, vocab_size=VOCAB, n_tags=TAGS, seed=seed)
        return [[(int(w[1:]), int(t[1:])) for w, t in s] for s in sents]

    def loss(self, sent):
        hs = self.rnn.transduce([dy.lookup(self.E, w) for w, _ in sent])
        return dy.esum([dy.pickneglogsoftmax(dy.affine_transform([self.b, self.W, h]), t)
                        for h, (_, t) in zip(hs, sent)])


class EncoderDecoder(Workload):
    name = "encdec"
    kind = "chain"
    BOS = 0

    def _build(self, pc, hidden):
        self.E_src = pc.add_lookup_parameters((VOCAB, hidden), name="E_src")
        self.E_tgt = pc.add_lookup_parameters((VOCAB, hidden), name="E_tgt")
        self.enc = dy.VanillaLSTMBuilder(1, hidden, hidden, pc)
        self.dec = dy.VanillaLSTMBuilder(1, hidden, hidden, pc)
        self.W = pc.add_parameters((VOCAB, hidden), name="W")
        self.b = pc.add_parameters((VOCAB,), init=dy.ConstInitializer(0.0), name="b")

    def instances(self, n: int, seed: int = 1) -> list:
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            src = ((rng.zipf(1.2, size=int(rng.integers(4, 31))) - 1) % (VOCAB - 1) + 1).tolist()
            tgt = src[::-1][:int(rng.integers(2, len(src) + 1))]
            out.append((src, tgt))
        return out

    def loss(self, pair):
        src, tgt = pair
        enc = self.enc.initial_state().add_inputs([dy.lookup(self.E_src, w) for w in src])[-1]
        s = self.dec.initial_state(list(enc.s()))
        losses = []
        for prev, w in zip([self.BOS] + tgt[:-1], tgt):
            s = s.add_input(dy.lookup(self.E_tgt, prev))
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([self.b, self.W, s.output()]), w))
        return dy.esum(losses)
