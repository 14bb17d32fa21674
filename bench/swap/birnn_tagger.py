"""Per-sentence tagger over a two-layer BiRNNBuilder of VanillaLSTMs, with an MLP on top."""
import dynet as dy
import numpy as np


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.birnn = dy.BiRNNBuilder(2, H, H, pc, dy.VanillaLSTMBuilder)
        for fb in self.birnn.builder_layers:
            for b in fb:
                for layer in b.get_parameters():
                    for p in layer:
                        p.set_value(rng.uniform(-0.1, 0.1, p.shape()).astype(np.float32))
        self.pH = pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (H, H)).astype(np.float32))
        self.pO = pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (n_out, H)).astype(np.float32))

    def loss(self, s):
        Hm, O = dy.parameter(self.pH), dy.parameter(self.pO)
        xs = [dy.lookup(self.E, w) for w in s.words]
        outs = self.birnn.transduce(xs)
        return dy.esum([dy.pickneglogsoftmax(O * dy.tanh(Hm * h), t) for h, t in zip(outs, s.tags)])
