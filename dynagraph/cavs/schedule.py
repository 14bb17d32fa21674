"""Input graphs and their schedule: children lists to rows, heights and tasks."""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from ..errors import DynagraphError, DynagraphIndexError, user_line


# =========================================================================== input graphs
class Graph:
    """One input graph: `children[v]` lists v's children (vertex indices of this graph);
    `types[v]` names (or numbers) v's vertex function when run() is given several."""
    __slots__ = ("children", "types")

    def __init__(self, children: Sequence[Sequence[int]], types: Sequence | None = None):
        self.children = children
        self.types = types

    def __len__(self) -> int:
        return len(self.children)

    @classmethod
    def from_tree(cls, tree, leaf="leaf", node="node") -> tuple["Graph", list]:
        """A datasets.Tree in post-order: (graph, nodes), nodes[v] being vertex v's Tree node."""
        nodes = tree.nodes_postorder()
        at = {id(n): v for v, n in enumerate(nodes)}
        children = [[at[id(c)] for c in n.children] for n in nodes]
        return cls(children, [leaf if n.is_leaf() else node for n in nodes]), nodes


def _unpack(g, s: int) -> tuple:
    if isinstance(g, Graph):
        return g.children, g.types
    if isinstance(g, dict):
        if "children" not in g:
            raise DynagraphError(f"dy.cavs.run: graph {s} is a dict without a 'children' list")
        return g["children"], g.get("types", g.get("type"))
    if isinstance(g, (list, tuple)) or (type(g) is np.ndarray and g.ndim == 2):
        return g, None
    raise TypeError(f"dy.cavs.run: graph {s} must be a dy.cavs.Graph, a dict, a list of children lists or "
                    f"an (n, k) integer array (-1: no child), got {type(g).__name__}")


def _flat_children(kid_lists: list, N: int) -> tuple:
    """(children per vertex, every child index in order). Graphs given as (n, k) integer
    arrays (-1 pads a missing child) are concatenated as they are: no Python per vertex."""
    if kid_lists and all(type(c) is np.ndarray and c.ndim == 2 for c in kid_lists) \
            and len({c.shape[1] for c in kid_lists}) == 1:
        kids = np.concatenate(kid_lists).reshape(-1)
        if kids.dtype.kind not in "iu":
            raise TypeError(f"dy.cavs.run: children arrays must hold integer vertex indices, got {kids.dtype}")
        return np.full(N, kid_lists[0].shape[1], dtype=np.int64), kids.astype(np.int64, copy=False)
    lists = [c.tolist() if type(c) is np.ndarray else c for c in kid_lists]
    counts = np.fromiter(map(len, itertools.chain.from_iterable(lists)), dtype=np.int64, count=N)
    try:
        kids = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(lists)),
                           dtype=np.int64, count=int(counts.sum()))
    except (TypeError, ValueError):
        raise TypeError("dy.cavs.run: children lists must hold int vertex indices (or -1: no child)") from None
    return counts, kids


def _levels_any_order(ch: Sequence, s: int) -> list:
    """Kahn's algorithm; a vertex left over sits on a cycle. -1 pads a missing child."""
    n = len(ch)
    parents: list = [[] for _ in range(n)]
    waiting = [sum(1 for c in k if c >= 0) for k in ch]
    for v, kids in enumerate(ch):
        for c in kids:
            if c >= 0:
                parents[c].append(v)
    lev = [0] * n
    ready = [v for v in range(n) if not waiting[v]]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for p in parents[v]:
            if lev[v] + 1 > lev[p]:
                lev[p] = lev[v] + 1
            waiting[p] -= 1
            if not waiting[p]:
                ready.append(p)
    if done < n:
        v = next(v for v in range(n) if waiting[v])
        raise DynagraphError(f"dy.cavs.run: graph {s} has a cycle through vertex {v} (children lists must "
                             f"form a DAG)\n  at {user_line()}")
    return lev


class _Schedule:
    """Where each vertex of a batch of input graphs goes: tasks, rows and child rows.

    Global vertex g = base[sample] + v. Vertices are sorted by (height, function);
    a task is one run of equal keys, so it owns contiguous rows of the state buffer
    (`rank`) and of its function's per-vertex buffers (`local`). Everything here is
    plain integer work on the input data, done before any kernel."""

    def __init__(self, graphs: Sequence, names: dict, arity: list):
        nf = len(arity)
        sizes, kid_lists, types = [], [], []
        for s, g in enumerate(graphs):
            ch, ty = _unpack(g, s)
            sizes.append(len(ch))
            kid_lists.append(ch)
            if ty is None:
                if nf > 1:
                    raise DynagraphError(f"dy.cavs.run: graph {s} has no vertex types, but there are {nf} vertex "
                                         f"functions; give Graph(children, types)")
                ty = np.zeros(len(ch), dtype=np.int64)
            elif len(ty) != len(ch):
                raise DynagraphError(f"dy.cavs.run: graph {s} has {len(ch)} children lists but {len(ty)} types")
            types.append(ty)
        self.S = len(sizes)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.N = N = int(self.base[-1])
        self.sample_of = np.repeat(np.arange(self.S), self.sizes)
        self.type = self._type_ids(types, names, nf)
        counts, kids = _flat_children(kid_lists, N)
        owner = np.repeat(np.arange(N), counts)
        pos = np.arange(len(kids)) - (np.cumsum(counts) - counts)[owner]  # child slot k of its vertex
        self._check_children(kids, owner, pos, arity, names)
        real = kids >= 0  # -1 pads a missing child: gather() reads zeros there
        gkids = kids[real] + self.base[self.sample_of[owner[real]]]
        self.tree = not len(gkids) or int(np.bincount(gkids, minlength=N).max()) <= 1
        self.has_parent = np.zeros(N, dtype=bool)
        self.has_parent[gkids] = True
        km = np.full((N, max(max(arity), 1)), -1, dtype=np.int64)
        km[owner[real], pos[real]] = gkids
        self.level = self._levels(km, kid_lists)
        self._order(nf, km)

    def _type_ids(self, per_graph: list, names: dict, nf: int) -> np.ndarray:
        if all(type(t) is np.ndarray for t in per_graph):
            arr = np.concatenate(per_graph) if per_graph else np.zeros(0, dtype=np.int64)
            types = arr
        else:
            types = [t for ty in per_graph for t in ty]
            arr = np.asarray(types) if types else np.zeros(0, dtype=np.int64)
        if arr.dtype.kind not in "iu":  # names (or a mix): map them, -1 when unknown
            arr = np.asarray([names.get(t, -1) if isinstance(t, str) else
                              (t if isinstance(t, (int, np.integer)) and not isinstance(t, bool) else -1)
                              for t in types], dtype=np.int64)
        arr = arr.astype(np.int64).reshape(self.N)
        bad = np.flatnonzero((arr < 0) | (arr >= nf))
        if bad.size:
            g = int(bad[0])
            s = int(self.sample_of[g])
            raise DynagraphError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has type {types[g]!r}; "
                                 f"the vertex functions are {list(names)} (or 0..{nf - 1})")
        return arr

    def _check_children(self, kids, owner, pos, arity, names) -> None:
        n_own = self.sizes[self.sample_of[owner]]
        bad = np.flatnonzero((kids < -1) | (kids >= n_own))
        if bad.size:
            j = int(bad[0])
            g = int(owner[j])
            s = int(self.sample_of[g])
            raise DynagraphIndexError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has child "
                                      f"{int(kids[j])}, out of range for a graph of {int(n_own[j])} vertices")
        ar = np.asarray(arity, dtype=np.int64)[self.type[owner]]
        over = np.flatnonzero((pos >= ar) & (kids >= 0))
        if over.size:
            g = int(owner[over[0]])
            s = int(self.sample_of[g])
            fname = list(names)[int(self.type[g])]
            raise DynagraphError(f"dy.cavs.run: graph {s}: vertex {g - int(self.base[s])} has a child in slot "
                                 f"{int(pos[over[0]])}, but its vertex function {fname} has arity {int(ar[over[0]])}")

    def _levels(self, km: np.ndarray, kid_lists: list) -> np.ndarray:
        """Height of every vertex (a leaf is 0) by relaxation: h = 1 + max over children, from
        all zeros, is exact after height + 1 sweeps. Deep graphs (long chains) or cycles
        fall back to one pass per graph in Python, which also names a cycle."""
        N = self.N
        inner = np.flatnonzero((km >= 0).any(axis=1))  # only vertices with children can change
        kmi = np.ascontiguousarray(np.where(km[inner] >= 0, km[inner], N).T)  # (slot, vertex): max over rows
        lev = np.zeros(N + 1, dtype=np.int64)
        lev[N] = -1
        for _ in range(48):
            new = lev[kmi].max(axis=0) + 1
            if np.array_equal(new, lev[inner]):
                return lev[:N]
            lev[inner] = new
        out: list = []
        for s, ch in enumerate(kid_lists):
            out.extend(_levels_any_order(ch, s))
        return np.asarray(out, dtype=np.int64).reshape(N)

    def _order(self, nf: int, km: np.ndarray) -> None:
        N = self.N
        key = self.level * nf + self.type
        order = np.argsort(key, kind="stable")
        self.rank = np.empty(N, dtype=np.int64)
        self.rank[order] = np.arange(N)
        ks, ts = key[order], self.type[order]
        local_sorted = np.empty(N, dtype=np.int64)
        self.count, self.members = [], []
        for f in range(nf):
            idx = np.flatnonzero(ts == f)
            local_sorted[idx] = np.arange(len(idx))
            self.count.append(len(idx))
            self.members.append(order[idx])  # global ids in this function's row order
        self.local = np.empty(N, dtype=np.int64)
        self.local[order] = local_sorted
        kso = km[order]
        child_rows = np.where(kso >= 0, self.rank[np.maximum(kso, 0)], N)  # row N of the state is zeros
        self.child_rows = child_rows  # (N, arity): row r's children, r in the state's order
        cuts = (np.flatnonzero(ks[1:] != ks[:-1]) + 1).tolist() if N else []
        bounds = [0] + cuts + [N] if N else [0]
        self.bounds = bounds  # task t owns state rows bounds[t]..bounds[t + 1]
        self.tasks = [(int(ts[s0]), s0, e0, int(local_sorted[s0]), child_rows[s0:e0])
                      for s0, e0 in zip(bounds[:-1], bounds[1:])]
        self.depth = int(self.level.max()) + 1 if N else 0
        self.widest = [0] * nf  # per function, its largest task: the size of per-task scratch
        for f, s0, e0, _, _ in self.tasks:
            self.widest[f] = max(self.widest[f], e0 - s0)

    def gid(self, sample: int, vertex: int) -> int:
        if not 0 <= sample < self.S:
            raise DynagraphIndexError(f"sample {sample} out of range: the run has {self.S} graphs")
        if not 0 <= vertex < int(self.sizes[sample]):
            raise DynagraphIndexError(f"vertex {vertex} out of range: graph {sample} has "
                                      f"{int(self.sizes[sample])} vertices")
        return int(self.base[sample]) + vertex
