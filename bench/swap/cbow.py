"""Per-sentence deep CBOW classifier: sum of embeddings, then layers of tanh(W h + b)."""
import dynet as dy
import numpy as np

LAYERS = 3


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.pWs = [pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (H, H)).astype(np.float32))
                    for _ in range(LAYERS)]
        self.pbs = [pc.parameters_from_numpy(np.zeros(H, np.float32)) for _ in range(LAYERS)]
        self.pW = pc.parameters_from_numpy(rng.uniform(-0.1, 0.1, (n_out, H)).astype(np.float32))
        self.pb = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def loss(self, s):
        h = dy.esum([dy.lookup(self.E, w) for w in s.words])
        for pW, pb in zip(self.pWs, self.pbs):
            h = dy.tanh(dy.parameter(pW) * h + dy.parameter(pb))
        return dy.pickneglogsoftmax(dy.parameter(self.pW) * h + dy.parameter(self.pb), s.label)
