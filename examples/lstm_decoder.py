"""An LSTM language model over SST sentences with greedy and beam decoding, batched across samples.

Decoding reads the model's scores at every step (argmax, top-k), so run one sentence after
another nothing batches. Inside dy.autobatch_map every read parks its sample and one evaluation
serves every prompt's step (greedy) or every prompt's whole beam (beam search). Training puts
the per-step output layer in `dy.phase(1)`, so all steps of all sentences share one batch.

    python examples/lstm_decoder.py                   # SST sentences if ../shared/data is present
    python examples/lstm_decoder.py --sequential 1    # the same code one prompt at a time
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter

import numpy as np

import dynagraph as dy
from dynagraph.datasets import read_sst, shared_data_path, synthetic_trees

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse_example_args  # noqa: E402

DEFAULTS = dict(train=600, prompts=32, epochs=2, batch_size=32, hidden=32, vocab=300, beam=3, max_len=12,
                seed=1, sequential=0)


class LanguageModel:
    def __init__(self, pc: dy.ParameterCollection, n_words: int, hidden: int):
        self.E = pc.add_lookup_parameters((n_words, hidden))
        self.lstm = dy.VanillaLSTMBuilder(1, hidden, hidden, pc)
        self.O, self.o = pc.add_parameters((n_words, hidden)), pc.add_parameters(n_words, init=0.0)

    def loss(self, sent: list[int]):
        """Teacher forced: the next-word losses, output layers deferred to phase 1."""
        state, losses = self.lstm.initial_state(), []
        for w, nxt in zip(sent, sent[1:]):
            state = state.add_input(self.E[w])
            with dy.phase(1):
                losses.append(dy.pickneglogsoftmax(self.O * state.output() + self.o, nxt))
        return dy.esum(losses)

    def greedy(self, first: int, eos: int, max_len: int) -> list[int]:
        state, out = self.lstm.initial_state(), [first]
        while len(out) < max_len and out[-1] != eos:
            state = state.add_input(self.E[out[-1]])
            out.append(int(np.argmax((self.O * state.output() + self.o).npvalue())))  # a read: parks
        return out

    def beam(self, first: int, eos: int, max_len: int, k: int) -> list[int]:
        hyps = [(0.0, [first], self.lstm.initial_state())]  # (log prob, words, state)
        while any(h[1][-1] != eos and len(h[1]) < max_len for h in hyps):
            grown = []
            for logp, words, state in hyps:
                if words[-1] == eos or len(words) >= max_len:
                    grown.append((logp, words, state))
                    continue
                nxt = state.add_input(self.E[words[-1]])
                scores = dy.log_softmax(self.O * nxt.output() + self.o).npvalue()  # every hypothesis'
                for w in np.argsort(-scores)[:k]:                                   # read, one chunk
                    grown.append((logp + float(scores[w]), words + [int(w)], nxt))
            hyps = sorted(grown, key=lambda h: -h[0])[:k]
        return hyps[0][1]


def load(n: int, vocab_size: int, seed: int) -> tuple[list[list[str]], str]:
    path = shared_data_path("sst", "train.txt")
    if path:
        rng = np.random.default_rng(seed)
        trees = read_sst(path)
        return [trees[i].words() for i in rng.permutation(len(trees))[:n]], "SST"
    return [t.words() for t in synthetic_trees(n, vocab_size=vocab_size, max_len=15, seed=seed)], "synthetic"


def parse_args(argv=None):
    return parse_example_args(__doc__, argv, **DEFAULTS)


def main(argv=None) -> dict:
    args = parse_args(argv)
    dy.config.set(random_seed=args.seed)
    sents, source = load(args.train + args.prompts, args.vocab, args.seed)
    common = [w for w, _ in Counter(w for s in sents for w in s).most_common(args.vocab - 3)]
    ids = {w: i + 3 for i, w in enumerate(common)}  # 0 <s>, 1 </s>, 2 <unk>
    encode = lambda s: [0] + [ids.get(w, 2) for w in s] + [1]  # noqa: E731
    train, prompts = [encode(s) for s in sents[:args.train]], [encode(s)[1] for s in sents[args.train:]]
    pc = dy.ParameterCollection()
    lm = LanguageModel(pc, args.vocab, args.hidden)
    trainer = dy.AdamTrainer(pc, 0.01)
    concurrent, losses = not args.sequential, []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        for k in range(0, len(train), args.batch_size):
            batch = train[k:k + args.batch_size]
            dy.renew_cg()
            loss = dy.esum(dy.autobatch_map(lm.loss, batch, concurrent=concurrent))
            loss = loss * (1.0 / sum(len(s) - 1 for s in batch))
            losses.append(loss.value())
            loss.backward()
            trainer.update()
        if not args.quiet:
            print(f"[{source}] epoch {epoch}: loss per word {np.mean(losses[-(len(train) // args.batch_size):]):.3f}"
                  f" ({len(train) / (time.perf_counter() - t0):.0f} sentences/s)")
    out = {"losses": losses, "source": source}
    for name, decode in [("greedy", lambda w: lm.greedy(w, 1, args.max_len)),
                         ("beam", lambda w: lm.beam(w, 1, args.max_len, args.beam))]:
        dy.renew_cg()
        t0 = time.perf_counter()
        texts = dy.autobatch_map(decode, prompts, concurrent=concurrent)
        out[name] = {"texts": texts, "batches": dy.cg().stats.batches,
                     "rate": len(prompts) / (time.perf_counter() - t0)}
        if not args.quiet:
            words = ["<s>", "</s>", "<unk>"] + common
            print(f"{name}: {out[name]['rate']:.0f} prompts/s, {out[name]['batches']} batches; e.g. "
                  f"{' '.join(words[i] for i in texts[0])}")
    return out


if __name__ == "__main__":
    main()
