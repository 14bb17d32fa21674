"""Per-sentence attention encoder-decoder (DyNet's attention.py example, word level).

Encoder: a BiLSTM (two VanillaLSTMBuilders); decoder: a VanillaLSTMBuilder fed
[previous word; context]; MLP attention over the encoder columns.
"""
import dynet as dy
import numpy as np

EOS = 0


def init(builder, rng):
    for layer in builder.get_parameters():
        for p in layer:
            p.set_value(rng.uniform(-0.1, 0.1, p.shape()).astype(np.float32))


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        u = lambda *shape: rng.uniform(-0.1, 0.1, shape).astype(np.float32)  # noqa: E731
        self.H = H
        self.src = pc.lookup_parameters_from_numpy(u(vocab, H))
        self.tgt = pc.lookup_parameters_from_numpy(u(vocab, H))
        self.enc_f = dy.VanillaLSTMBuilder(1, H, H, pc)
        self.enc_b = dy.VanillaLSTMBuilder(1, H, H, pc)
        self.dec = dy.VanillaLSTMBuilder(1, 3 * H, H, pc)
        for b in (self.enc_f, self.enc_b, self.dec):
            init(b, rng)
        self.pW1 = pc.parameters_from_numpy(u(H, 2 * H))
        self.pW2 = pc.parameters_from_numpy(u(H, H))
        self.pv = pc.parameters_from_numpy(u(1, H))
        self.pWo = pc.parameters_from_numpy(u(vocab, H))
        self.pbo = pc.parameters_from_numpy(np.zeros(vocab, np.float32))

    def encode(self, words):
        xs = [self.src[w] for w in words]
        fw = self.enc_f.initial_state().transduce(xs)
        bw = self.enc_b.initial_state().transduce(xs[::-1])[::-1]
        return [dy.concatenate([f, b]) for f, b in zip(fw, bw)]

    def attend(self, enc, w1enc, state, W2, v):
        scores = dy.transpose(v * dy.tanh(dy.colwise_add(w1enc, W2 * state.output())))
        return enc * dy.softmax(scores)

    def loss(self, pair):
        source, target = pair
        W1, W2, v = dy.parameter(self.pW1), dy.parameter(self.pW2), dy.parameter(self.pv)
        Wo, bo = dy.parameter(self.pWo), dy.parameter(self.pbo)
        enc = dy.concatenate_cols(self.encode(source))
        w1enc = W1 * enc
        state = self.dec.initial_state().add_input(dy.concatenate([dy.zeros(2 * self.H), self.tgt[EOS]]))
        losses, prev = [], EOS
        for w in list(target) + [EOS]:
            ctx = self.attend(enc, w1enc, state, W2, v)
            state = state.add_input(dy.concatenate([ctx, self.tgt[prev]]))
            losses.append(dy.pickneglogsoftmax(Wo * state.output() + bo, w))
            prev = w
        return dy.esum(losses)
