"""pull() data into the run and push() views out of it."""
from __future__ import annotations

import numpy as np

from ..errors import DynagraphError, DynagraphIndexError
from ..expression import Expression
from ..ops.base import CHEAP, OpDef, SparseRows
from ..parameters import LookupParameters
from .schedule import _Schedule


# =========================================================================== pull data
class _Pull:
    """The external inputs: an embedding table with ids, or one expression per vertex."""

    def __init__(self, pull, sched: _Schedule, nf: int):
        self.kind, self.table, self.exprs = None, None, []
        self.shapes: list = [None] * nf
        if pull is None:
            return
        if isinstance(pull, tuple) and len(pull) == 2 and isinstance(pull[0], LookupParameters):
            self._table(pull[0], pull[1], sched, nf)
        else:
            self._expressions(pull, sched, nf)

    def _table(self, E: LookupParameters, ids, sched: _Schedule, nf: int) -> None:
        self.kind, self.table = "table", E
        if len(ids) != sched.S:
            raise DynagraphError(f"dy.cavs.run: pull ids for {len(ids)} graphs, but {sched.S} graphs were given")
        flat = []
        for s, w in enumerate(ids):
            if len(w) != int(sched.sizes[s]):
                raise DynagraphError(f"dy.cavs.run: graph {s} has {int(sched.sizes[s])} vertices but {len(w)} "
                                     f"pull ids (use -1 or None for a vertex without input)")
            flat.extend(w)
        try:
            arr = np.asarray(flat, dtype=np.int64).reshape(sched.N)
        except (TypeError, ValueError):
            arr = np.asarray([-1 if x is None else x for x in flat], dtype=np.int64).reshape(sched.N)
        rows = E.values.shape[0]
        bad = np.flatnonzero((arr < -1) | (arr >= rows))
        if bad.size:
            g = int(bad[0])
            s = int(sched.sample_of[g])
            raise DynagraphIndexError(f"dy.cavs.run: pull id {int(arr[g])} of graph {s} vertex "
                                      f"{g - int(sched.base[s])} is out of range for {E.name()} ({rows} rows)")
        self.ids = [arr[m] for m in sched.members]  # per function, in its row order
        self.shapes = [tuple(E.values.shape[1:])] * nf

    def _expressions(self, pull, sched: _Schedule, nf: int) -> None:
        self.kind = "exprs"
        get = pull if callable(pull) else None
        if get is None and len(pull) != sched.S:
            raise DynagraphError(f"dy.cavs.run: pull expressions for {len(pull)} graphs, but {sched.S} graphs "
                                 f"were given")
        self.rows: list = [[] for _ in range(nf)]
        self.argpos: list = [[] for _ in range(nf)]
        for s in range(sched.S):
            n = int(sched.sizes[s])
            xs = [get(s, v) for v in range(n)] if get is not None else pull[s]
            if len(xs) != n:
                raise DynagraphError(f"dy.cavs.run: graph {s} has {n} vertices but {len(xs)} pull expressions "
                                     f"(use None for a vertex without input)")
            base = int(sched.base[s])
            for v, x in enumerate(xs):
                if x is None:
                    continue
                if type(x) is not Expression:
                    raise TypeError(f"dy.cavs.run: pull for graph {s} vertex {v} must be an Expression or None, "
                                    f"got {type(x).__name__}")
                f = int(sched.type[base + v])
                shape = x.cg.shape[x.i]
                if self.shapes[f] is None:
                    self.shapes[f] = shape
                elif self.shapes[f] != shape:
                    raise DynagraphError(f"dy.cavs.run: pull for graph {s} vertex {v} has shape {shape}, other "
                                         f"vertices of the same function pull {self.shapes[f]}")
                self.rows[f].append(int(sched.local[base + v]))
                self.argpos[f].append(len(self.exprs))
                self.exprs.append(x)

    @property
    def n_args(self) -> int:
        return len(self.exprs) + (1 if self.kind == "table" else 0)

    def values(self, xp, xs: tuple, f: int, nv: int, dtype, ids=None):
        """This function's pull matrix (rows, *shape): ONE gather from the table (rows `ids`,
        default every vertex of f) or from the run node's expression arguments."""
        shape = self.shapes[f]
        if self.kind == "table":
            ids = self.ids[f] if ids is None else ids
            X = xp.take(xs[len(self.exprs)][0], np.maximum(ids, 0), axis=0)
            missing = ids < 0
            if missing.any():
                X[missing] = 0
            return X
        X = xp.zeros((nv,) + shape, dtype=dtype)
        if self.argpos[f]:
            X[np.asarray(self.rows[f])] = xp.concatenate([xs[k] for k in self.argpos[f]], axis=0)
        return X

    def unique(self, f: int):
        """(distinct ids, inverse, order, group starts) when f's vertices repeat table rows enough
        for hoisted work per distinct row to pay; else None."""
        if self.kind != "table" or not len(self.ids[f]):
            return None
        uniq, inv = np.unique(self.ids[f], return_inverse=True)
        if len(uniq) > 0.9 * len(inv):
            return None
        perm = np.argsort(inv, kind="stable")
        starts = np.flatnonzero(np.r_[True, inv[perm][1:] != inv[perm][:-1]])
        return uniq, inv, perm, starts

    def grads(self, xp, gX: list, need: tuple, ids: list) -> list:
        """Gradients for the run node's leading arguments (expressions, then the table);
        gX[f] holds rows for table rows ids[f] (table) or for f's vertices (expressions)."""
        out: list = [None] * self.n_args
        if self.kind == "table":
            if need[len(self.exprs)]:
                idx, vals = [], []
                for g, rows in zip(gX, ids):
                    if g is not None:
                        keep = rows >= 0
                        idx.append(rows[keep])
                        vals.append(g[keep])
                if idx:
                    out[-1] = SparseRows(np.concatenate(idx), xp.concatenate(vals))
            return out
        for f, g in enumerate(gX):
            if g is None:
                continue
            for r, k in zip(self.rows[f], self.argpos[f]):
                if need[k]:
                    out[k] = g[r:r + 1]
        return out




class _PushTable:
    """Pushed rows of one vertex function, bound in the imperative graph like an embedding
    table: view nodes read rows of it without copying it, and their gradients arrive as
    sparse rows (`grad`, `touched`, add_sparse_grad: the LookupParameters protocol the
    backends use), which the run node's backward then consumes."""
    is_lookup = True
    updated = True

    def __init__(self, name: str, values: np.ndarray):
        self._name, self.values = name, values
        self._grad = self._touched = None  # allocated by the first gradient: most runs reach backward
        # once, and a forward-only run never does

    @property
    def grad(self) -> np.ndarray:
        if self._grad is None:
            self._grad = np.zeros_like(self.values)
        return self._grad

    @grad.setter
    def grad(self, g: np.ndarray) -> None:  # `p.grad += g` (a dense gradient) sets it back
        self._grad = g

    @property
    def touched(self) -> np.ndarray:
        if self._touched is None:
            self._touched = np.zeros(self.values.shape[0], dtype=bool)
        return self._touched

    def name(self) -> str:
        return self._name

    def add_sparse_grad(self, idx, g) -> None:
        np.add.at(self.grad, idx, g)
        self.touched[idx] = True

    def take_grad(self):
        """The accumulated gradient, or None when no pushed value was used; resets it."""
        if self._touched is None or not self._touched.any():
            return None
        g, self._grad, self._touched = self.grad, None, None
        return g




# ----------------------------------------------------------------------- push views
def _push_shape(a, table, run):
    return a[0]


def _push_check(a, row, table, run):
    if not 0 <= row < table[0]:
        raise IndexError(f"pushed row {row} out of range ({table[0]} rows)")


def _push_forward(xp, a, data, table, run):
    return table[0][xp.asarray(data)]


def _push_backward(xp, a, data, xs, y, g, need):
    return (SparseRows(np.asarray(data), g) if need[0] else None,
            xp.zeros((len(data), 1), dtype=g.dtype) if need[1] else None)


# A pushed value: args (the function's push table, the run node), data = its row.
# All views of one run and function share a signature: one batched copy.
CAVS_PUSH = OpDef("cavs_push", _push_shape, _push_forward, _push_backward, check=_push_check,
                  uses_data=True, cost=CHEAP)
