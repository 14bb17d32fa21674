"""Tagger over two VanillaLSTMBuilders (forward and backward), as in DyNet's tagger example."""
import dynet as dy
import numpy as np


def set_weights(builder, rng):
    for layer in builder.get_parameters():
        for p in layer:
            p.set_value(rng.uniform(-0.1, 0.1, p.shape()).astype(np.float32))


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.fwd = dy.VanillaLSTMBuilder(1, H, H, pc)
        self.bwd = dy.VanillaLSTMBuilder(1, H, H, pc)
        set_weights(self.fwd, rng)
        set_weights(self.bwd, rng)
        self.pWo = pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (n_out, 2 * H)).astype(np.float32))
        self.pbo = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def begin(self):
        self.Wo, self.bo = dy.parameter(self.pWo), dy.parameter(self.pbo)

    def loss(self, s):
        xs = [dy.lookup(self.E, w) for w in s.words]
        fw = self.fwd.initial_state().transduce(xs)
        bw = self.bwd.initial_state().transduce(xs[::-1])[::-1]
        return dy.esum([dy.pickneglogsoftmax(self.Wo * dy.concatenate([f, b]) + self.bo, t)
                        for f, b, t in zip(fw, bw, s.tags)])
