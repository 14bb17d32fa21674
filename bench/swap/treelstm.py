"""Binary TreeLSTM over post-order trees (leaf: words[k] >= 0; node: children left[k], right[k])."""
import dynet as dy
import numpy as np


def glorot(rng, rows, cols):
    s = np.sqrt(6.0 / (rows + cols))
    return rng.uniform(-s, s, (rows, cols)).astype(np.float32)


class Model:
    def __init__(self, pc, H, vocab, n_out, rng):
        self.H = H
        self.E = pc.lookup_parameters_from_numpy(rng.uniform(-0.1, 0.1, (vocab, H)).astype(np.float32))
        self.pW_iou = pc.parameters_from_numpy(glorot(rng, 3 * H, H))
        self.pb_iou = pc.parameters_from_numpy(np.zeros(3 * H, np.float32))
        self.pU = pc.parameters_from_numpy(glorot(rng, 5 * H, 2 * H))
        self.pb = pc.parameters_from_numpy(np.zeros(5 * H, np.float32))
        self.pW_out = pc.parameters_from_numpy(glorot(rng, n_out, H))
        self.pb_out = pc.parameters_from_numpy(np.zeros(n_out, np.float32))

    def begin(self):
        self.W_iou, self.b_iou = dy.parameter(self.pW_iou), dy.parameter(self.pb_iou)
        self.U, self.b = dy.parameter(self.pU), dy.parameter(self.pb)
        self.W_out, self.b_out = dy.parameter(self.pW_out), dy.parameter(self.pb_out)

    def leaf(self, w):
        H = self.H
        g = dy.affine_transform([self.b_iou, self.W_iou, dy.lookup(self.E, w)])
        gates = dy.logistic(dy.pick_range(g, 0, 2 * H))
        i, o = dy.pick_range(gates, 0, H), dy.pick_range(gates, H, 2 * H)
        c = dy.cmult(i, dy.tanh(dy.pick_range(g, 2 * H, 3 * H)))
        return dy.cmult(o, dy.tanh(c)), c

    def node(self, left, right):
        H = self.H
        (hl, cl), (hr, cr) = left, right
        g = dy.affine_transform([self.b, self.U, dy.concatenate([hl, hr])])
        gates = dy.logistic(dy.pick_range(g, 0, 4 * H))
        i, fl = dy.pick_range(gates, 0, H), dy.pick_range(gates, H, 2 * H)
        fr, o = dy.pick_range(gates, 2 * H, 3 * H), dy.pick_range(gates, 3 * H, 4 * H)
        u = dy.tanh(dy.pick_range(g, 4 * H, 5 * H))
        c = dy.esum([dy.cmult(i, u), dy.cmult(fl, cl), dy.cmult(fr, cr)])
        return dy.cmult(o, dy.tanh(c)), c

    def loss(self, t):
        states = []
        for w, l, r in zip(t.words, t.left, t.right):
            states.append(self.leaf(w) if l < 0 else self.node(states[l], states[r]))
        return dy.pickneglogsoftmax(dy.affine_transform([self.b_out, self.W_out, states[-1][0]]), t.label)
