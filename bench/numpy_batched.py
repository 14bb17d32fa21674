"""Hand-batched numpy TreeLSTM and Tree-FC: the practical upper bound for batching.

All nodes of one height (distance from the leaves) across the whole minibatch
are computed by one GEMM per weight matrix; backward walks the heights in
reverse with hand-written gradients, then plain SGD. Same parameters and maths
as bench/dy_models.py, so the losses match the other systems.
Building the level index is part of each timed step, as recording is for the
dynamic systems.
"""
from __future__ import annotations

import numpy as np


class Levels:
    """Minibatch nodes renumbered by height: leaves first, then height 1, 2, ..."""

    def __init__(self, batch: list):
        heights, offsets = [], []
        words, base = [], 0
        for t in batch:  # post-order: children come before their parent
            h = []
            for w, l, r in zip(t.words, t.left, t.right):
                h.append(0 if l < 0 else 1 + max(h[l], h[r]))
            heights.append(h)
            offsets.append(base)
            base += len(h)
        hs = np.fromiter((x for h in heights for x in h), dtype=np.int64, count=base)
        order = np.argsort(hs, kind="stable")
        pos = np.empty(base, dtype=np.int64)
        pos[order] = np.arange(base)     # global node id -> row in the level-sorted arrays
        counts = np.bincount(hs)
        self.bounds = np.concatenate([[0], np.cumsum(counts)])
        left = np.fromiter((l + o if l >= 0 else -1 for t, o in zip(batch, offsets) for l in t.left),
                           dtype=np.int64, count=base)
        right = np.fromiter((r + o if r >= 0 else -1 for t, o in zip(batch, offsets) for r in t.right),
                            dtype=np.int64, count=base)
        words = np.fromiter((w for t in batch for w in t.words), dtype=np.int64, count=base)
        self.n_leaves = int(counts[0])
        self.words = words[order[:self.n_leaves]]
        self.left, self.right = pos[left[order]], pos[right[order]]  # meaningful for internal rows
        self.roots = pos[np.array([o + len(h) - 1 for o, h in zip(offsets, heights)])]
        self.labels = np.array([t.label for t in batch])
        self.n = base

    def levels(self):
        """(start, stop, left rows, right rows) per internal height, bottom up."""
        for k in range(1, len(self.bounds) - 1):
            s, e = int(self.bounds[k]), int(self.bounds[k + 1])
            yield s, e, self.left[s:e], self.right[s:e]


def _sigmoid(x):
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # overflow-free logistic


def _root_loss(p: dict, g: dict | None, h: np.ndarray, dh: np.ndarray | None, L: Levels) -> float:
    hr = h[L.roots]
    s = hr @ p["W_out"].T + p["b_out"]
    s = s - s.max(axis=1, keepdims=True)
    logz = np.log(np.exp(s).sum(axis=1))
    loss = float((logz - s[np.arange(len(L.roots)), L.labels]).sum())
    if g is not None:
        ds = np.exp(s - logz[:, None])
        ds[np.arange(len(L.roots)), L.labels] -= 1.0
        g["W_out"] = ds.T @ hr
        g["b_out"] = ds.sum(axis=0)
        dh[L.roots] += ds @ p["W_out"]
    return loss


class NumpyModel:
    """Hand-batched model with the DyModel step() interface."""

    def __init__(self, kind: str, arrays: dict, lr: float):
        if kind not in ("treelstm", "treefc"):
            raise ValueError(f"no hand-batched numpy version of {kind!r}")
        self.kind, self.lr = kind, lr
        self.p = {k: a.copy() for k, a in arrays.items()}
        self.H = arrays["E"].shape[1]

    def step(self, batch: list, train: bool, timer: dict | None = None) -> float:
        L = Levels(batch)
        g = {} if train else None
        loss = (self._treelstm if self.kind == "treelstm" else self._treefc)(L, g)
        if train:
            self._sgd(g)
        return loss

    def _sgd(self, g: dict) -> None:
        rows, dE = g.pop("E")
        for k, d in g.items():
            self.p[k] -= self.lr * d
        self.p["E"][rows] -= self.lr * dE

    def _embedding_grad(self, L: Levels, dX: np.ndarray):
        """Sparse gradient of the table: (unique rows, summed row gradients)."""
        rows, inv = np.unique(L.words, return_inverse=True)
        dE = np.zeros((len(rows), dX.shape[1]), dtype=dX.dtype)
        np.add.at(dE, inv, dX)
        return rows, dE

    # ------------------------------------------------------------------ Tree-FC
    def _treefc(self, L: Levels, g: dict | None) -> float:
        p = self.p
        h = np.empty((L.n, self.H), dtype=np.float32)
        h[:L.n_leaves] = p["E"][L.words]
        for s, e, l, r in L.levels():
            h[s:e] = np.tanh(h[l] @ p["W_l"].T + h[r] @ p["W_r"].T + p["b"])
        dh = np.zeros_like(h) if g is not None else None
        loss = _root_loss(p, g, h, dh, L)
        if g is None:
            return loss
        for k in ("W_l", "W_r", "b"):
            g[k] = np.zeros_like(p[k])
        for s, e, l, r in reversed(list(L.levels())):
            dz = dh[s:e] * (1.0 - h[s:e] ** 2)
            g["W_l"] += dz.T @ h[l]
            g["W_r"] += dz.T @ h[r]
            g["b"] += dz.sum(axis=0)
            dh[l] += dz @ p["W_l"]  # each node has one parent: no repeated rows in l or r
            dh[r] += dz @ p["W_r"]
        g["E"] = self._embedding_grad(L, dh[:L.n_leaves])
        return loss

    # ----------------------------------------------------------------- TreeLSTM
    def _treelstm(self, L: Levels, g: dict | None) -> float:
        p, H, nl = self.p, self.H, L.n_leaves
        h = np.empty((L.n, H), dtype=np.float32)
        c = np.empty_like(h)
        tc = np.empty_like(h)            # tanh(c), kept for backward
        X = p["E"][L.words]
        G0 = X @ p["W_iou"].T + p["b_iou"]
        i0, o0, u0 = _sigmoid(G0[:, :H]), _sigmoid(G0[:, H:2 * H]), np.tanh(G0[:, 2 * H:])
        c[:nl] = i0 * u0
        tc[:nl] = np.tanh(c[:nl])
        h[:nl] = o0 * tc[:nl]
        gates = []                        # (i, f_l, f_r, o, u) per level
        for s, e, l, r in L.levels():
            G = h[l] @ p["U_l"].T + h[r] @ p["U_r"].T + p["b"]
            a = _sigmoid(G[:, :4 * H])
            i, fl, fr, o = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            u = np.tanh(G[:, 4 * H:])
            c[s:e] = i * u + fl * c[l] + fr * c[r]
            tc[s:e] = np.tanh(c[s:e])
            h[s:e] = o * tc[s:e]
            gates.append((a, u))
        dh = np.zeros_like(h) if g is not None else None
        loss = _root_loss(p, g, h, dh, L)
        if g is None:
            return loss
        dc = self._treelstm_backward(L, g, h, c, tc, gates, dh)
        dc0 = dc[:nl] + dh[:nl] * o0 * (1.0 - tc[:nl] ** 2)
        dG0 = np.concatenate([dc0 * u0 * i0 * (1.0 - i0), dh[:nl] * tc[:nl] * o0 * (1.0 - o0),
                              dc0 * i0 * (1.0 - u0 ** 2)], axis=1)
        g["W_iou"] = dG0.T @ X
        g["b_iou"] = dG0.sum(axis=0)
        g["E"] = self._embedding_grad(L, dG0 @ p["W_iou"])
        return loss

    def _treelstm_backward(self, L, g, h, c, tc, gates, dh) -> np.ndarray:
        """Internal levels top down; returns the cell gradients (the leaves' rows are final)."""
        p, H = self.p, self.H
        dc = np.zeros_like(c)
        for k in ("U_l", "U_r", "b"):
            g[k] = np.zeros_like(p[k])
        for (s, e, l, r), (a, u) in zip(reversed(list(L.levels())), reversed(gates)):
            i, fl, fr, o = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            dcn = dc[s:e] + dh[s:e] * o * (1.0 - tc[s:e] ** 2)
            da = np.concatenate([dcn * u, dcn * c[l], dcn * c[r], dh[s:e] * tc[s:e]], axis=1) * a * (1.0 - a)
            dG = np.concatenate([da, dcn * i * (1.0 - u ** 2)], axis=1)
            dc[l] += dcn * fl
            dc[r] += dcn * fr
            g["U_l"] += dG.T @ h[l]
            g["U_r"] += dG.T @ h[r]
            g["b"] += dG.sum(axis=0)
            dh[l] += dG @ p["U_l"]
            dh[r] += dG @ p["U_r"]
        return dc
