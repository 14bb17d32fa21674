"""Per-sentence sentiment classifier: VanillaLSTMBuilder.transduce, last state to a softmax."""
import dynet as dy
import numpy as np


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.lstm = dy.VanillaLSTMBuilder(1, H, H, pc)
        for layer in self.lstm.get_parameters():
            for p in layer:
                p.set_value(rng.uniform(-0.1, 0.1, p.shape()).astype(np.float32))
        self.pW = pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (n_out, H)).astype(np.float32))
        self.pb = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def loss(self, s):
        W, b = dy.parameter(self.pW), dy.parameter(self.pb)
        hs = self.lstm.initial_state().transduce([self.E[w] for w in s.words])
        return dy.pickneglogsoftmax(W * hs[-1] + b, s.label)
