"""The same four models in PyTorch, run per sample (eager, no batching across samples).

Node for node the computation of bench/dy_models.py. The embedding rows a
sample needs are fetched in one `F.embedding` call per sample (sparse gradient),
which is how a PyTorch user writes it; everything else runs one node at a time.
Import only inside a worker: torch must never be imported by dynagraph or tests.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchModel:
    def __init__(self, kind: str, arrays: dict, lr: float):
        self.kind = kind
        self.H = arrays["E"].shape[1]
        self.p = {k: torch.nn.Parameter(torch.from_numpy(a.copy())) for k, a in arrays.items()}
        self.opt = torch.optim.SGD(list(self.p.values()), lr=lr)  # sparse grads for E, M: plain SGD only
        self.sample_loss = getattr(self, f"_{kind}")

    def step(self, batch: list, train: bool, timer: dict | None = None) -> float:
        if not train:
            with torch.no_grad():
                return float(sum(self.sample_loss(s) for s in batch))
        loss = torch.stack([self.sample_loss(s) for s in batch]).sum()
        value = float(loss.detach())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return value

    def _embed(self, name: str, words: list):
        return F.embedding(torch.tensor(words), self.p[name], sparse=True)

    # ------------------------------------------------------------------ trees
    def _tree(self, t, leaf, node, lookups: tuple = ("E",)):
        leaves = [w for w in t.words if w >= 0]
        rows = [self._embed(n, leaves) for n in lookups]
        states, k = [], 0
        for w, l, r in zip(t.words, t.left, t.right):
            if l < 0:
                states.append(leaf(*[x[k] for x in rows]))
                k += 1
            else:
                states.append(node(states[l], states[r]))
        return states[-1]

    def _root_loss(self, h, label: int):
        return -torch.log_softmax(torch.addmv(self.p["b_out"], self.p["W_out"], h), 0)[label]

    def _treelstm(self, t):
        p, H = self.p, self.H

        def leaf(x):
            g = torch.addmv(p["b_iou"], p["W_iou"], x)
            c = torch.sigmoid(g[0:H]) * torch.tanh(g[2 * H:3 * H])
            return torch.sigmoid(g[H:2 * H]) * torch.tanh(c), c

        def node(left, right):
            g = torch.addmv(torch.addmv(p["b"], p["U_l"], left[0]), p["U_r"], right[0])
            i, fl, fr, o = (torch.sigmoid(g[k * H:(k + 1) * H]) for k in range(4))
            c = i * torch.tanh(g[4 * H:5 * H]) + fl * left[1] + fr * right[1]
            return o * torch.tanh(c), c

        return self._root_loss(self._tree(t, leaf, node)[0], t.label)

    def _treefc(self, t):
        p = self.p
        h = self._tree(t, lambda x: x,
                       lambda l, r: torch.tanh(torch.addmv(torch.addmv(p["b"], p["W_l"], l), p["W_r"], r)))
        return self._root_loss(h, t.label)

    def _mvrnn(self, t):
        p, H = self.p, self.H

        def leaf(x, m):
            return x, m.view(H, H).t()  # DyNet's reshape is column-major

        def node(left, right):
            (a, A), (b, B) = left, right
            z = torch.addmv(torch.addmv(p["b"], p["W1"], B @ a), p["W2"], A @ b)
            return torch.tanh(z), p["WM1"] @ A + p["WM2"] @ B

        return self._root_loss(self._tree(t, leaf, node, ("E", "M"))[0], t.label)

    # ---------------------------------------------------------------- tagging
    def _lstm(self, xs: list, d: str) -> list:
        p, H = self.p, self.H
        Wx, Wh, b = p["Wx_" + d], p["Wh_" + d], p["b_" + d]
        hs, h, c = [], None, None
        for x in xs:
            g = torch.addmv(b, Wx, x) if h is None else torch.addmv(torch.addmv(b, Wx, x), Wh, h)
            iu = torch.sigmoid(g[0:H]) * torch.tanh(g[3 * H:4 * H])
            c = iu if c is None else torch.sigmoid(g[H:2 * H]) * c + iu
            h = torch.sigmoid(g[2 * H:3 * H]) * torch.tanh(c)
            hs.append(h)
        return hs

    def _bilstm(self, s):
        p = self.p
        X = self._embed("E", s.words)
        xs = [X[k] for k in range(len(s.words))]
        fw, bw = self._lstm(xs, "f"), self._lstm(xs[::-1], "b")[::-1]
        losses = [-torch.log_softmax(torch.addmv(torch.addmv(p["b_out"], p["W_of"], f), p["W_ob"], b), 0)[tag]
                  for f, b, tag in zip(fw, bw, s.tags)]
        return torch.stack(losses).sum()

