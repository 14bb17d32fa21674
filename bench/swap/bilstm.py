"""BiLSTM tagger with the LSTM cell written from primitive ops (as many DyNet users write it)."""
import dynet as dy
import numpy as np


def glorot(rng, rows, cols):
    s = np.sqrt(6.0 / (rows + cols))
    return rng.uniform(-s, s, (rows, cols)).astype(np.float32)


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.H = H
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.p = {}
        for d in "fb":
            self.p["Wx" + d] = pc.parameters_from_numpy(glorot(rng, 4 * H, H))
            self.p["Wh" + d] = pc.parameters_from_numpy(glorot(rng, 4 * H, H))
            self.p["b" + d] = pc.parameters_from_numpy(np.zeros(4 * H, np.float32))
        self.p["Wo"] = pc.parameters_from_numpy(glorot(rng, n_out, 2 * H))
        self.p["bo"] = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def begin(self):
        self.e = {k: dy.parameter(p) for k, p in self.p.items()}

    def lstm(self, xs, d):
        H, e = self.H, self.e
        Wx, Wh, b = e["Wx" + d], e["Wh" + d], e["b" + d]
        h = c = None
        hs = []
        for x in xs:
            g = dy.affine_transform([b, Wx, x] if h is None else [b, Wx, x, Wh, h])
            i = dy.logistic(dy.pick_range(g, 0, H))
            f = dy.logistic(dy.pick_range(g, H, 2 * H))
            o = dy.logistic(dy.pick_range(g, 2 * H, 3 * H))
            u = dy.tanh(dy.pick_range(g, 3 * H, 4 * H))
            c = dy.cmult(i, u) if c is None else dy.cmult(f, c) + dy.cmult(i, u)
            h = dy.cmult(o, dy.tanh(c))
            hs.append(h)
        return hs

    def loss(self, s):
        xs = [dy.lookup(self.E, w) for w in s.words]
        fw, bw = self.lstm(xs, "f"), self.lstm(xs[::-1], "b")[::-1]
        Wo, bo = self.e["Wo"], self.e["bo"]
        return dy.esum([dy.pickneglogsoftmax(dy.affine_transform([bo, Wo, dy.concatenate([f, b])]), t)
                        for f, b, t in zip(fw, bw, s.tags)])
