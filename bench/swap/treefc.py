"""Tree-FC: h = tanh(W * concatenate([l, r]) + b) over complete binary trees."""
import dynet as dy
import numpy as np


def glorot(rng, rows, cols):
    s = np.sqrt(6.0 / (rows + cols))
    return rng.uniform(-s, s, (rows, cols)).astype(np.float32)


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.pW = pc.parameters_from_numpy(glorot(rng, H, 2 * H))
        self.pb = pc.parameters_from_numpy(np.zeros(H, np.float32))
        self.pW_out = pc.parameters_from_numpy(glorot(rng, n_out, H))
        self.pb_out = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def begin(self):
        self.W, self.b = dy.parameter(self.pW), dy.parameter(self.pb)
        self.W_out, self.b_out = dy.parameter(self.pW_out), dy.parameter(self.pb_out)

    def loss(self, t):
        hs = []
        for w, l, r in zip(t.words, t.left, t.right):
            if l < 0:
                hs.append(dy.lookup(self.E, w))
            else:
                hs.append(dy.tanh(self.W * dy.concatenate([hs[l], hs[r]]) + self.b))
        return dy.pickneglogsoftmax(self.W_out * hs[-1] + self.b_out, t.label)
