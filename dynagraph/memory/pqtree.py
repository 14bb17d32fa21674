"""A PQ tree (Booth & Lueker 1976), written from the published templates.

A PQ tree represents a set of permutations of a ground set: leaves are the
elements; a P-node's children may appear in any order; a Q-node's children
appear in the given order or its reverse. `reduce(S)` restricts the set to the
permutations in which the elements of S are consecutive.

The reduction here is the templates' bottom-up labelling done recursively on the
*pertinent subtree* (the smallest subtree holding all of S): every node is EMPTY
(no leaf of S), FULL (only leaves of S) or PARTIAL. A partial node below the
pertinent root must put its full leaves at one end (templates P3/P5/Q2), and is
returned as a sequence of children ordered empty -> full, so that the parent can
splice it in (this is how a partial child becomes part of a Q-node). The
pertinent root may hold the full leaves in the middle (P2/P4/P6, Q3).

A reduction that fails leaves the tree unchanged: it runs on a copy that only
replaces the tree on success. That costs O(n) per reduction, which is cheap for
the few hundred elements a layout plan has.
"""
from __future__ import annotations

import itertools
import math
from typing import Hashable, Iterable, Iterator

LEAF, P, Q = "leaf", "P", "Q"
EMPTY, FULL, PARTIAL = 0, 1, 2


class Node:
    __slots__ = ("kind", "children", "parent", "value")

    def __init__(self, kind: str, children: list | None = None, value=None):
        self.kind = kind
        self.children = children if children is not None else []
        self.parent = None
        self.value = value
        for c in self.children:
            c.parent = self

    def __repr__(self) -> str:
        if self.kind == LEAF:
            return repr(self.value)
        inner = ", ".join(map(repr, self.children))
        return f"P{{{inner}}}" if self.kind == P else f"Q[{inner}]"


class Infeasible(Exception):
    """The constraint contradicts the ones already applied."""


def _make(kind: str, children: list) -> Node:
    """A node over `children`, normalised: one child is the child itself, a
    two-child Q-node is a P-node (both allow exactly the two orders)."""
    if len(children) == 1:
        return children[0]
    if kind == Q and len(children) == 2:
        kind = P
    return Node(kind, children)


class PQTree:
    def __init__(self, elements: Iterable[Hashable]):
        elems = list(elements)
        if len(set(elems)) != len(elems):
            raise ValueError("PQTree: elements must be distinct")
        self.leaves = {e: Node(LEAF, value=e) for e in elems}
        self.root = None
        if elems:
            self.root = _make(P, [self.leaves[e] for e in elems])
            self.root.parent = None

    # ------------------------------------------------------------------ copies
    def copy(self) -> "PQTree":
        t = PQTree([])
        t.root = _clone(self.root, t.leaves) if self.root is not None else None
        return t

    def _assign(self, other: "PQTree") -> None:
        self.root, self.leaves = other.root, other.leaves

    # --------------------------------------------------------------- reduction
    def reduce(self, S: Iterable[Hashable]) -> bool:
        """Constrain the elements of S to be consecutive. Returns False (tree
        unchanged) when no represented permutation satisfies all constraints."""
        S = set(S)
        missing = S - self.leaves.keys()
        if missing:
            raise KeyError(f"PQTree.reduce: unknown elements {sorted(map(repr, missing))}")
        if len(S) <= 1 or len(S) == len(self.leaves):
            return True
        work = self.copy()
        try:
            work._reduce(S)
        except Infeasible:
            return False
        self._assign(work)
        return True

    def _reduce(self, S: set) -> None:
        full = _full_counts(self.root, S)
        root = self.root
        while True:  # descend to the pertinent root: the deepest node holding all of S
            nxt = [c for c in root.children if full[id(c)][0] == len(S)]
            if not nxt:
                break
            root = nxt[0]
        if full[id(root)][0] == full[id(root)][1]:
            return  # S is exactly the leaf set of a subtree: already consecutive
        new = _root_template(root, full)
        parent = root.parent
        if parent is None:
            self.root = new
        else:
            parent.children[parent.children.index(root)] = new
        _relink(self.root, None)

    # ----------------------------------------------------------------- reading
    def frontier(self) -> list:
        out: list = []
        if self.root is not None:
            _frontier(self.root, out)
        return out

    def count(self) -> int:
        return _count(self.root) if self.root is not None else 1

    def permutations(self) -> Iterator[tuple]:
        if self.root is None:
            yield ()
            return
        yield from (tuple(p) for p in _perms(self.root))

    def represents(self, perm: Iterable[Hashable]) -> bool:
        """Is `perm` one of the permutations this tree stands for? O(n log n)."""
        perm = list(perm)
        if len(perm) != len(self.leaves) or set(perm) != self.leaves.keys():
            return False
        if self.root is None:
            return True
        pos = {e: i for i, e in enumerate(perm)}
        return _span(self.root, pos) is not None

    def check(self) -> None:
        """Raise AssertionError on a broken structural invariant."""
        seen: list = []
        if self.root is not None:
            assert self.root.parent is None, "root has a parent"
            _check(self.root, seen)
        assert len(seen) == len(set(seen)) == len(self.leaves), "every element exactly once"
        assert set(seen) == set(self.leaves), "leaves match the ground set"
        for e, leaf in self.leaves.items():
            n = leaf
            while n.parent is not None:
                n = n.parent
            assert n is self.root, f"leaf {e!r} is not under the root"

    def __repr__(self) -> str:
        return f"PQTree({self.root!r})"


# ---------------------------------------------------------------- helpers
def _clone(n: Node, leaves: dict) -> Node:
    if n.kind == LEAF:
        c = Node(LEAF, value=n.value)
        leaves[n.value] = c
        return c
    return Node(n.kind, [_clone(c, leaves) for c in n.children])


def _relink(n: Node, parent) -> None:
    n.parent = parent
    for c in n.children:
        _relink(c, n)


def _full_counts(root: Node, S: set) -> dict:
    """id(node) -> (leaves of S below it, leaves below it); iterative post-order."""
    out: dict = {}
    stack = [(root, False)]
    while stack:
        n, done = stack.pop()
        if n.kind == LEAF:
            out[id(n)] = (1 if n.value in S else 0, 1)
        elif done:
            f = t = 0
            for c in n.children:
                cf, ct = out[id(c)]
                f += cf
                t += ct
            out[id(n)] = (f, t)
        else:
            stack.append((n, True))
            stack.extend((c, False) for c in n.children)
    return out


def _label(n: Node, full: dict) -> int:
    f, t = full[id(n)]
    return EMPTY if f == 0 else FULL if f == t else PARTIAL


def _group(children: list) -> list:
    """Several same-label children of a P-node become one P-node (or stay one child)."""
    return [] if not children else [_make(P, children)]


def _split(n: Node, full: dict):
    """Children of n by label; partial ones are reduced to their empty->full sequences."""
    empty, fulls, partial = [], [], []
    for c in n.children:
        lab = _label(c, full)
        if lab == EMPTY:
            empty.append(c)
        elif lab == FULL:
            fulls.append(c)
        else:
            partial.append(_partial_seq(c, full))
    return empty, fulls, partial


def _partial_seq(n: Node, full: dict) -> list:
    """A partial node below the pertinent root: its full leaves must sit at one end.
    Returns the new children sequence ordered empty -> full (templates P3/P5, Q2)."""
    if n.kind == P:
        empty, fulls, partial = _split(n, full)
        if len(partial) > 1:
            raise Infeasible
        mid = partial[0] if partial else []
        return _group(empty) + mid + _group(fulls)
    labels, seqs = _q_children(n, full)
    # E* [P] F* as is, or F* [P] E* read backwards; a partial child must sit on the border.
    for lab, seq in ((labels, seqs), (labels[::-1], seqs[::-1])):
        flat = _empty_then_full(lab, seq)
        if flat is not None:
            return flat
    raise Infeasible


def _q_children(n: Node, full: dict):
    """Labels of a Q-node's children, and each child as the node sequence it splices in."""
    labels, seqs = [], []
    for c in n.children:
        lab = _label(c, full)
        labels.append(lab)
        seqs.append(_partial_seq(c, full) if lab == PARTIAL else [c])
    return labels, seqs


def _empty_then_full(labels: list, seqs: list) -> list | None:
    """The spliced children if the labels read E* [PARTIAL] F*, else None."""
    out, phase = [], EMPTY  # phase: which block we are in
    for lab, seq in zip(labels, seqs):
        if lab == EMPTY and phase != EMPTY:
            return None
        if lab == PARTIAL:
            if phase != EMPTY:
                return None
            phase = PARTIAL
        elif lab == FULL:
            phase = FULL
        out.extend(seq)
    return out


def _root_template(n: Node, full: dict) -> Node:
    """Reduce at the pertinent root: the full leaves may sit in the middle (P2/P4/P6, Q3)."""
    if n.kind == P:
        empty, fulls, partial = _split(n, full)
        if len(partial) > 2:
            raise Infeasible
        if not partial:  # P2: the full children become one P-node
            return _make(P, empty + _group(fulls))
        seq = partial[0] + _group(fulls) + (partial[1][::-1] if len(partial) == 2 else [])
        q = _make(Q, seq)  # P4 / P6
        return _make(P, empty + [q]) if empty else q
    labels, seqs = _q_children(n, full)
    first = next(k for k, l in enumerate(labels) if l != EMPTY)
    last = max(k for k, l in enumerate(labels) if l != EMPTY)
    if any(l != FULL for l in labels[first + 1:last]):
        raise Infeasible  # Q3 needs E* [P] F* [P] E*
    out = []
    for k, (lab, seq) in enumerate(zip(labels, seqs)):
        if lab != PARTIAL:
            out.extend(seq)
        elif k == first and k != last:
            out.extend(seq)           # empty -> full, towards the full block
        elif k == last and k != first:
            out.extend(seq[::-1])     # full -> empty, away from it
        else:
            raise Infeasible  # a lone partial child would itself be the pertinent root
    return _make(Q, out)


def _frontier(n: Node, out: list) -> None:
    stack = [n]
    while stack:
        m = stack.pop()
        if m.kind == LEAF:
            out.append(m.value)
        else:
            stack.extend(reversed(m.children))


def _count(n: Node) -> int:
    if n.kind == LEAF:
        return 1
    k = math.factorial(len(n.children)) if n.kind == P else 2
    for c in n.children:
        k *= _count(c)
    return k


def _perms(n: Node) -> Iterator[list]:
    if n.kind == LEAF:
        yield [n.value]
        return
    orders = itertools.permutations(n.children) if n.kind == P else (n.children, n.children[::-1])
    for order in orders:
        for parts in itertools.product(*[list(_perms(c)) for c in order]):
            yield [e for p in parts for e in p]


def _span(n: Node, pos: dict):
    """(first, last) position of n's leaves in the permutation if n's constraints
    hold there, else None."""
    if n.kind == LEAF:
        p = pos[n.value]
        return (p, p, 1)
    spans = []
    size = 0
    for c in n.children:
        s = _span(c, pos)
        if s is None:
            return None
        spans.append(s)
        size += s[2]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    if hi - lo + 1 != size:
        return None
    if n.kind == Q:
        starts = [s[0] for s in spans]
        if starts != sorted(starts) and starts != sorted(starts, reverse=True):
            return None
    return (lo, hi, size)


def _check(n: Node, seen: list) -> None:
    if n.kind == LEAF:
        assert not n.children, "a leaf has children"
        seen.append(n.value)
        return
    assert n.kind in (P, Q), f"unknown node kind {n.kind}"
    need = 2 if n.kind == P else 3
    assert len(n.children) >= need, f"{n.kind}-node with {len(n.children)} children"
    for c in n.children:
        assert c.parent is n, "parent pointer mismatch"
        _check(c, seen)
