"""The four models written once against the DyNet API, per sample.

The same code runs on dynagraph and on DyNet: the `dy` module is passed in.
Everything is plain dy ops (no builders) so that the PyTorch and numpy
versions can mirror the computation exactly, node for node.

    TreeLSTM  leaf:  [i, o, u] = W_iou x + b_iou;  c = s(i) t(u);  h = s(o) t(c)
              node:  [i, f_l, f_r, o, u] = U_l h_l + U_r h_r + b
                     c = s(i) t(u) + s(f_l) c_l + s(f_r) c_r;  h = s(o) t(c)
    Tree-FC   leaf:  h = x;  node: h = tanh(W_l h_l + W_r h_r + b)
    MV-RNN    leaf:  (a, A) = (E[w], reshape(M[w], H x H))
              node:  p = tanh(W1 (B a) + W2 (A b) + b);  P = WM1 A + WM2 B
    BiLSTM    per direction  [i, f, o, u] = Wx x_t + Wh h_{t-1} + b (no Wh term at t=0)
              c = s(f) c_{t-1} + s(i) t(u);  h = s(o) t(c);  scores_t = W_of h_f + W_ob h_b + b_out
Tree losses are pickneglogsoftmax(W_out h_root + b_out, label); tagging sums the token losses.
"""
from __future__ import annotations

from typing import Any

from .params import LOOKUPS


class DyModel:
    """Parameters, a per-sample loss, and one training/inference step for a minibatch."""

    def __init__(self, dy: Any, kind: str, arrays: dict, lr: float, renew_kwargs: dict | None = None):
        self.dy, self.kind = dy, kind
        self.H = arrays["E"].shape[1]
        self.pc = dy.ParameterCollection()
        # Copies: dynagraph's *_from_numpy keeps the caller's array (DyNet copies), and
        # training would then change the shared initial values of the next system.
        self.P = {k: (self.pc.lookup_parameters_from_numpy(a.copy()) if k in LOOKUPS
                      else self.pc.parameters_from_numpy(a.copy())) for k, a in arrays.items()}
        self.trainer = dy.SimpleSGDTrainer(self.pc, learning_rate=lr)
        self.trainer.set_clip_threshold(0)  # plain SGD in every system (DyNet clips by default)
        self.renew_kwargs = renew_kwargs or {}
        self.sample_loss = getattr(self, f"_{kind}")

    def begin(self) -> None:
        """Trained parameter expressions for the new graph (`expr()` alone would be constant)."""
        self.e = {k: p.expr(True) for k, p in self.P.items() if k not in LOOKUPS}

    def graph(self, batch: list):
        """Record the minibatch: the summed loss expression of the current graph."""
        self.dy.renew_cg(**self.renew_kwargs)
        self.begin()
        return self.dy.esum([self.sample_loss(s) for s in batch])

    def step(self, batch: list, train: bool, timer: dict | None = None) -> float:
        loss = self.graph(batch)
        value = loss.value()
        if train:
            loss.backward()
            if timer is not None:
                import time
                t0 = time.perf_counter()
                self.trainer.update()
                timer["update"] = timer.get("update", 0.0) + time.perf_counter() - t0
            else:
                self.trainer.update()
        return value

    # ------------------------------------------------------------------ trees
    def _tree(self, t, leaf, node):
        states = []
        for w, l, r in zip(t.words, t.left, t.right):
            states.append(leaf(w) if l < 0 else node(states[l], states[r]))
        return states[-1]

    def _root_loss(self, h, label: int):
        dy, e = self.dy, self.e
        return dy.pickneglogsoftmax(dy.affine_transform([e["b_out"], e["W_out"], h]), label)

    def _treelstm(self, t):
        dy, e, H, E = self.dy, self.e, self.H, self.P["E"]

        def leaf(w):
            g = dy.affine_transform([e["b_iou"], e["W_iou"], dy.lookup(E, w)])
            c = dy.cmult(dy.logistic(dy.pick_range(g, 0, H)), dy.tanh(dy.pick_range(g, 2 * H, 3 * H)))
            return dy.cmult(dy.logistic(dy.pick_range(g, H, 2 * H)), dy.tanh(c)), c

        def node(left, right):
            g = dy.affine_transform([e["b"], e["U_l"], left[0], e["U_r"], right[0]])
            i, fl = dy.logistic(dy.pick_range(g, 0, H)), dy.logistic(dy.pick_range(g, H, 2 * H))
            fr, o = dy.logistic(dy.pick_range(g, 2 * H, 3 * H)), dy.logistic(dy.pick_range(g, 3 * H, 4 * H))
            u = dy.tanh(dy.pick_range(g, 4 * H, 5 * H))
            c = dy.cmult(i, u) + dy.cmult(fl, left[1]) + dy.cmult(fr, right[1])
            return dy.cmult(o, dy.tanh(c)), c

        return self._root_loss(self._tree(t, leaf, node)[0], t.label)

    def _treefc(self, t):
        dy, e, E = self.dy, self.e, self.P["E"]
        h = self._tree(t, lambda w: dy.lookup(E, w),
                       lambda l, r: dy.tanh(dy.affine_transform([e["b"], e["W_l"], l, e["W_r"], r])))
        return self._root_loss(h, t.label)

    def _mvrnn(self, t):
        dy, e, H, E, M = self.dy, self.e, self.H, self.P["E"], self.P["M"]

        def leaf(w):
            return dy.lookup(E, w), dy.reshape(dy.lookup(M, w), (H, H))

        def node(left, right):
            (a, A), (b, B) = left, right
            p = dy.tanh(dy.affine_transform([e["b"], e["W1"], B * a, e["W2"], A * b]))
            return p, e["WM1"] * A + e["WM2"] * B

        return self._root_loss(self._tree(t, leaf, node)[0], t.label)

    # ---------------------------------------------------------------- tagging
    def _lstm(self, xs: list, d: str) -> list:
        dy, e, H = self.dy, self.e, self.H
        Wx, Wh, b = e["Wx_" + d], e["Wh_" + d], e["b_" + d]
        hs, h, c = [], None, None
        for x in xs:
            g = dy.affine_transform([b, Wx, x] if h is None else [b, Wx, x, Wh, h])
            iu = dy.cmult(dy.logistic(dy.pick_range(g, 0, H)), dy.tanh(dy.pick_range(g, 3 * H, 4 * H)))
            c = iu if c is None else dy.cmult(dy.logistic(dy.pick_range(g, H, 2 * H)), c) + iu
            h = dy.cmult(dy.logistic(dy.pick_range(g, 2 * H, 3 * H)), dy.tanh(c))
            hs.append(h)
        return hs

    def _bilstm(self, s):
        dy, e, E = self.dy, self.e, self.P["E"]
        xs = [dy.lookup(E, w) for w in s.words]
        fw, bw = self._lstm(xs, "f"), self._lstm(xs[::-1], "b")[::-1]
        return dy.esum([dy.pickneglogsoftmax(dy.affine_transform([e["b_out"], e["W_of"], f, e["W_ob"], b]), tag)
                        for f, b, tag in zip(fw, bw, s.tags)])
