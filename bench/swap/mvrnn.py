"""MV-RNN (Socher et al. 2012): a vector and a matrix per word from lookup tables, A[r] * a[l]."""
import dynet as dy
import numpy as np


def glorot(rng, rows, cols):
    s = np.sqrt(6.0 / (rows + cols))
    return rng.uniform(-s, s, (rows, cols)).astype(np.float32)


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.H = H
        eye = np.eye(H, dtype=np.float32)
        near = lambda base: (base + rng.uniform(-0.01, 0.01, base.shape)).astype(np.float32)  # noqa: E731
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.M = pc.lookup_parameters_from_numpy(np.stack([near(eye).reshape(-1, order="F") for _ in range(vocab)]))
        self.pW = pc.parameters_from_numpy(glorot(rng, H, 2 * H))
        self.pb = pc.parameters_from_numpy(np.zeros(H, np.float32))
        self.pWM = pc.parameters_from_numpy(near(np.hstack([0.5 * eye, 0.5 * eye])))
        self.pW_out = pc.parameters_from_numpy(glorot(rng, n_out, H))
        self.pb_out = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def begin(self):
        self.W, self.b, self.WM = dy.parameter(self.pW), dy.parameter(self.pb), dy.parameter(self.pWM)
        self.W_out, self.b_out = dy.parameter(self.pW_out), dy.parameter(self.pb_out)

    def loss(self, t):
        H, states = self.H, []
        for w, l, r in zip(t.words, t.left, t.right):
            if l < 0:
                states.append((dy.lookup(self.E, w), dy.reshape(dy.lookup(self.M, w), (H, H))))
                continue
            (a, A), (b, B) = states[l], states[r]
            p = dy.tanh(self.W * dy.concatenate([B * a, A * b]) + self.b)
            P = self.WM * dy.concatenate([A, B])
            states.append((p, P))
        return dy.pickneglogsoftmax(self.W_out * states[-1][0] + self.b_out, t.label)
