"""BiLSTM named-entity tagger on WikiNER, in the style of DyNet's bilstm-tagger example.

    python examples/bilstm_tagger.py

Per sentence: word embeddings -> dy.BiRNNBuilder (VanillaLSTMBuilder in each
direction) -> tanh MLP -> softmax per token. Sentences of a minibatch share one
graph, so the LSTM steps of all sentences at the same position run together.
Uses ../shared/data/wikiner/dev.txt when present (split into train/test), else
synthetic tagged sentences.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import numpy as np

import dynagraph as dy
from dynagraph.datasets import Vocab, read_wikiner, shared_data_path, synthetic_tagging

try:
    from tqdm import tqdm
except ImportError:
    def tqdm(it, **_):
        return it

Sentence = list  # list of (word, tag)
SHAPES = ("lower", "Capitalized", "UPPER", "digit", "other")


def word_shape(w: str) -> int:
    """Capitalisation class: the main cue for names once words are lower-cased."""
    if w.islower():
        return 0
    if w[:1].isupper():
        return 2 if w.isupper() and len(w) > 1 else 1
    return 3 if any(c.isdigit() for c in w) else 4


class Tagger:
    def __init__(self, pc: dy.ParameterCollection, words: Vocab, tags: Vocab, emb_dim: int, hidden: int,
                 mlp_dim: int, layers: int = 1, shape_dim: int = 8):
        self.words, self.tags = words, tags
        self.E = pc.add_lookup_parameters((len(words), emb_dim), name="E")
        self.S = pc.add_lookup_parameters((len(SHAPES), shape_dim), name="S")
        self.bilstm = dy.BiRNNBuilder(layers, emb_dim + shape_dim, 2 * hidden, pc, dy.VanillaLSTMBuilder)
        self.W_h = pc.add_parameters((mlp_dim, 2 * hidden), name="W_h")
        self.b_h = pc.add_parameters((mlp_dim,), init=dy.ConstInitializer(0.0), name="b_h")
        self.W_o = pc.add_parameters((len(tags), mlp_dim), name="W_o")
        self.b_o = pc.add_parameters((len(tags),), init=dy.ConstInitializer(0.0), name="b_o")

    def scores(self, words: list[str]) -> list:
        xs = [dy.concatenate([dy.lookup(self.E, self.words[w.lower()]), dy.lookup(self.S, word_shape(w))])
              for w in words]
        return [dy.affine_transform([self.b_o, self.W_o, dy.tanh(dy.affine_transform([self.b_h, self.W_h, h]))])
                for h in self.bilstm.transduce(xs)]

    def loss(self, sent: Sentence):
        outs = self.scores([w for w, _ in sent])
        return dy.esum([dy.pickneglogsoftmax(o, self.tags[t]) for o, (_, t) in zip(outs, sent)])


def load_data(n_train: int, n_test: int, seed: int) -> tuple[list, list, str]:
    """WikiNER (one file, shuffled with `seed` then split) or synthetic sentences."""
    path = shared_data_path("wikiner", "dev.txt")
    if path:
        sents = read_wikiner(path)
        order = np.random.default_rng(seed).permutation(len(sents))
        sents = [sents[i] for i in order]
        return sents[:n_train], sents[n_train:n_train + n_test], "WikiNER"
    sents = synthetic_tagging(n_train + n_test, max_len=30, vocab_size=2000, n_tags=9, seed=seed)
    return sents[:n_train], sents[n_train:], "synthetic"


def outside_tag(sents: list) -> str:
    """The tag of tokens outside any entity: "O" in WikiNER. Synthetic sentences have no "O";
    their most frequent tag plays its part, so the second accuracy still leaves the easy,
    frequent tokens out (with no "O" at all it would count every token, repeating the first)."""
    counts = Counter(t for s in sents for _, t in s)
    return "O" if "O" in counts else counts.most_common(1)[0][0]


def accuracy(tagger: Tagger, sents: list, batch_size: int = 64, scheduler=None,
             outside: str = "O") -> tuple[float, float]:
    """(token accuracy, accuracy on tokens whose gold tag is not `outside`); unknown words map to UNK."""
    correct = total = ent_correct = ent_total = 0
    for s in range(0, len(sents), batch_size):
        batch = sents[s:s + batch_size]
        dy.renew_cg(scheduler=scheduler)
        outs = [tagger.scores([w for w, _ in sent]) for sent in batch]
        dy.cg().forward()
        for sent, o in zip(batch, outs):
            pred = [tagger.tags.word(int(np.argmax(e.npvalue()))) for e in o]
            correct += sum(p == t for p, (_, t) in zip(pred, sent))
            total += len(sent)
            ent_correct += sum(p == t for p, (_, t) in zip(pred, sent) if t != outside)
            ent_total += sum(t != outside for _, t in sent)
    return correct / max(total, 1), ent_correct / max(ent_total, 1)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=1000, help="training sentences (default 1000)")
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--emb-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=32, help="LSTM size per direction")
    ap.add_argument("--mlp-dim", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01, help="Adam step size")
    ap.add_argument("--scheduler", default=None, choices=dy.schedulers.available())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    dy.reset_random_seed(args.seed)
    train, test, source = load_data(args.train, args.test, args.seed)
    # min_count=2: singletons stay UNK so the model learns an UNK embedding for test time.
    words = Vocab.build((w.lower() for s in train for w, _ in s), min_count=2)
    tags = Vocab.build(t for s in train + test for _, t in s)
    pc = dy.ParameterCollection()
    tagger = Tagger(pc, words, tags, args.emb_dim, args.hidden, args.mlp_dim)
    trainer = dy.AdamTrainer(pc, alpha=args.lr)
    say = (lambda *a: None) if args.quiet else print
    say(f"{source}: {len(train)} train / {len(test)} test sentences, {len(words)} words, {len(tags) - 1} tags")
    outside = outside_tag(train)
    losses, accs, ent_accs = [], [], []
    for epoch in range(args.epochs):
        t0, total, n_tok = time.perf_counter(), 0.0, 0
        batches = [train[i:i + args.batch_size] for i in range(0, len(train), args.batch_size)]
        bar = tqdm(batches, desc=f"epoch {epoch + 1}", unit="batch", disable=args.quiet, leave=False)
        for batch in bar:
            dy.renew_cg(scheduler=args.scheduler)
            loss = dy.esum([tagger.loss(s) for s in batch])
            tokens = sum(len(s) for s in batch)
            total += loss.value()
            n_tok += tokens
            (loss * (1.0 / tokens)).backward()
            trainer.update()
            if not args.quiet:
                bar.set_postfix(loss=f"{total / n_tok:.3f}")
        losses.append(total / n_tok)
        acc, ent_acc = accuracy(tagger, test, scheduler=args.scheduler, outside=outside)
        accs.append(acc)
        ent_accs.append(ent_acc)
        say(f"epoch {epoch + 1}: loss/token {losses[-1]:.4f}  test accuracy {acc:.3f} "
            f"({'entity' if outside == 'O' else 'non-' + outside} tokens {ent_acc:.3f})  "
            f"{n_tok / (time.perf_counter() - t0):.0f} tokens/s")
    return {"losses": losses, "test_acc": accs, "entity_acc": ent_accs, "source": source}


if __name__ == "__main__":
    main(sys.argv[1:])
