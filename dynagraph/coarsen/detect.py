"""Finding repeated subgraphs in the pending nodes of a recorded graph.

Per-sample code repeats one op pattern at every tree node and time step. Here the
pending nodes are cut into *instances*, and instances with the same canonical key
(same signatures, same internal wiring, same sharing of outside inputs) form a
*pattern*: each pattern runs through the compiled-block machinery of `dy.block`.

How nodes become instances (one pass, consumers before producers, so in
decreasing node id; the compiled pass `dynagraph._coarsen.plan` also groups the
instances into patterns and computes the unit schedule, see run.Coarsened):

* a node whose consumers all belong to one instance joins it (a fan-in cone:
  the gate slices of an LSTM join the products that read them), unless it is
  shaped like a member (the same structure two levels deep: signature, the
  arguments' signatures and theirs) or has the root's signature and a consumer
  of the same signature as the root's: then it is the previous repetition's
  output (a child's `h` read by its parent's `concatenate`) and starts an
  instance of its own;
* a node read by several instances joins the one with the smallest root id,
  unless that instance already holds a node of its signature (that is the next
  repetition: the previous step's `h` stays the root of its own step; shaped like
  one of its members too, it is a repetition output, see below) or it reads no
  node of the chunk (a word's embedding read by both directions of a BiLSTM: kept
  op-level, it does not tie one direction's steps to the other's levels);
* a node shaped like a repetition output cut so far anywhere in the chunk starts
  one too (the root of a tree's last cell is read by the loss, not by a parent:
  without this rule it joined the loss's instance, and each tree's root cell became
  a pattern of its own at every depth, with few instances per group);
* otherwise, or when the instance is full (`MAX_NODES`), it is a root: the
  last node of a new instance.

Every cross-instance edge goes from an instance with a smaller root id to one
with a larger root id, so the instances form a DAG ordered by root id.

Nodes that cannot be coarsened (leaves, inputs without arguments, unbatchable
ops, nodes that keep a saved context such as `dy.block` calls) stay op-level and
act as instances of their own, which no other node joins.
"""
from __future__ import annotations

from typing import NamedTuple

try:  # the per-node pass compiled (kernels/cpython/coarsen.c); instances_py is its twin
    from .. import _coarsen as _NATIVE
except ImportError:  # pragma: no cover - built without a compiler
    _NATIVE = None

MAX_NODES = 48          # instance size cap: keeps patterns small and repeating
MIN_CALLS = 2           # a pattern is coarsened only if it occurs at least this often
MAX_ARGS = 8            # a wider node (the esum of a mini-batch's losses) is a reduction: op-level
DEFER_HEIGHT = 2        # units this close to the chunk's sinks run as late as possible (run._defer)


class Pattern(NamedTuple):
    key: tuple                # per member in node-id order: signature id, argument count, argument refs
    roots: list               # one root node per instance
    members: list             # per instance, its node ids in id order (position m = step m)
    externals: list           # per instance, its outside arguments in first-use order
    slots: list               # per instance, the per-node data (indices, labels, random keys)


def coarsenable(op, arg_ops: list) -> bool:
    """Ops a plan can run per instance. A node computed from parameters alone stays
    op-level: inside a plan its value would be one shared row, and its gradient the sum
    over the instances rather than each node's own."""
    if not 0 < len(arg_ops) <= MAX_ARGS or op.leaf or not op.batchable or op.saves_ctx:
        return False
    return op.uses_data or not all(o.leaf for o in arg_ops)


def find_patterns(cg, pending: list) -> tuple[list, list]:
    """(patterns, instance root of each pending node by id - pending[0])
    among `pending` (ascending node ids). Nodes of instances that were not coarsened keep
    their root as sort key: every edge between instances goes to a larger root."""
    if len(pending) < 2 * MIN_CALLS:
        return [], []
    if _NATIVE is not None:
        owner, instances = _NATIVE.find(cg.args, cg.sig, cg.op, cg.data, pending, MAX_NODES, MAX_ARGS,
                                        len(cg.signatures))
    else:
        owner, instances = instances_py(cg, pending)
    by_key: dict = {}
    for r, ms, key, ext, slots in instances:
        p = by_key.get(key)
        if p is None:
            by_key[key] = Pattern(key, [r], [ms], [ext], [slots])
        else:
            p.roots.append(r)
            p.members.append(ms)
            p.externals.append(ext)
            p.slots.append(slots)
    return [p for p in by_key.values() if len(p.roots) >= MIN_CALLS], owner


class Head(NamedTuple):
    """A pattern as running it needs it: its key, and its first instance (to trace)."""
    key: tuple
    members: tuple            # the first instance's node ids in id order
    externals: tuple          # its outside arguments in first-use order
    count: int                # instances of the pattern in the chunk


def heads(patterns: list) -> list:
    """find_patterns' patterns as Heads."""
    return [Head(p.key, tuple(p.members[0]), tuple(p.externals[0]), len(p.roots)) for p in patterns]


def payloads(patterns: list, batches: list) -> list:
    """A unit schedule over instance indices (Coarsened.schedule_py) with each group's
    payload as the compiled pass gives it: (per member position a tuple of node ids, per
    outside argument a tuple of node ids, per instance its slots)."""
    out = []
    for pi, g in batches:
        if pi < 0:
            out.append((pi, g))
            continue
        p = patterns[pi]
        out.append((pi, (tuple(zip(*[p.members[w] for w in g])), tuple(zip(*[p.externals[w] for w in g])),
                         tuple(p.slots[w] for w in g))))
    return out


def plan_native(cg, pending: list) -> tuple[list, list] | None:
    """(heads, batches) from the compiled pass in one call: the patterns (as `heads` gives
    them) and the unit schedule with each group's node ids (as `payloads` gives it), with
    no Python object per instance; None where dynagraph._coarsen is not built."""
    if _NATIVE is None:
        return None
    if len(pending) < 2 * MIN_CALLS:
        return [], []
    pats, batches = _NATIVE.plan(cg.args, cg.sig, cg.op, cg.data, pending, MAX_NODES, MAX_ARGS,
                                 len(cg.signatures), MIN_CALLS, DEFER_HEIGHT)
    return [Head(*p) for p in pats], batches


def instances_py(cg, pending: list) -> tuple[list, list]:
    """The pure-Python twin of dynagraph._coarsen.find: (owner, [(root, members, key,
    externals, slots)]) for every instance of two or more nodes."""
    lo = pending[0]
    is_pending = [False] * (pending[-1] - lo + 1)
    for n in pending:
        is_pending[n - lo] = True
    owner, excluded, size = _owners(cg, pending, is_pending)
    return owner, _instance_list(cg, pending, owner, excluded, size)


def _owners(cg, pending: list, is_pending: list) -> tuple[list, set, dict]:
    """Each pending node's instance root (index n - pending[0]), the excluded roots, instance sizes.
    Per node: cmin, the smallest instance root among its consumers; cmulti, consumers in more
    than one instance; csig, the signature of its last-recorded consumer."""
    lo, span, args, ops, sig = pending[0], len(is_pending), cg.args, cg.op, cg.sig
    owner, cmin, csig, cmulti = [-1] * span, [-1] * span, [-1] * span, [False] * span
    excluded: set = set()
    repeated: set = set()  # shapes of the repetition outputs cut so far (see the module doc)
    size, sigs_of, shapes_of, can = {}, {}, {}, {}
    for n in reversed(pending):
        k = n - lo
        a_n = args[n]
        ok = can.get(sig[n])  # a function of the signature (op, and which arguments are parameters)
        if ok is None:
            ok = can[sig[n]] = coarsenable(ops[n], [ops[a] for a in a_n])
        if not ok:
            excluded.add(n)
            owner[k] = r = n
        else:
            m = cmin[k]
            shape = _shape2(n, args, sig)
            if m < 0 or m in excluded or size[m] >= MAX_NODES or shape in repeated:
                r = n
            elif not cmulti[k]:
                # shaped like a member (its signature, arguments of the same signatures) or
                # read like the root: the previous repetition's output (a child's h read by its
                # parent's concatenate), cut there
                r = n if shape in shapes_of[m] or (
                    sig[n] == sig[m] and 0 <= csig[m - lo] == csig[k]) else m
                if r == n:
                    repeated.add(shape)
            elif not any(0 <= a - lo < span and is_pending[a - lo] for a in a_n):
                r = n   # an input read by several instances (a word's embedding): op-level, level 0
            elif sig[n] not in sigs_of[m]:
                r = m
            else:
                r = n
                if shape in shapes_of[m]:   # shaped like a member of the next repetition too
                    repeated.add(shape)
            owner[k] = r
            if r == n:
                size[n] = 1
                sigs_of[n] = {sig[n]}
                shapes_of[n] = {shape}
            else:
                size[r] += 1
                sigs_of[r].add(sig[n])
                shapes_of[r].add(shape)
        _note_consumer(a_n, lo, is_pending, sig[n], r, cmin, csig, cmulti)
    return owner, excluded, size


def _note_consumer(a_n, lo: int, is_pending: list, sig_n: int, r: int, cmin: list, csig: list,
                   cmulti: list) -> None:
    """_owners' per-argument bookkeeping: the pending arguments a_n of a node of signature sig_n,
    owned by instance root r, learn their consumer (see _owners)."""
    for a in a_n:
        j = a - lo
        if j >= 0 and is_pending[j]:
            if csig[j] < 0:
                csig[j] = sig_n
            c = cmin[j]
            if c < 0:
                cmin[j] = r
            elif c != r:
                cmulti[j] = True
                if r < c:
                    cmin[j] = r


def _instance_list(cg, pending: list, owner: list, excluded: set, size: dict) -> list:
    """[(root, members, key, externals, slots)] for every instance of two or more nodes."""
    lo, args, sig, ops = pending[0], cg.args, cg.sig, cg.op
    members: dict = {}
    for n in pending:
        r = owner[n - lo]
        if r not in excluded and size[r] > 1:
            ms = members.get(r)
            if ms is None:
                members[r] = [n]
            else:
                ms.append(n)
    data = cg.data
    out = []
    for r in sorted(members):
        ms = members[r]
        out.append((r, ms) + _instance_key(ms, args, sig, ops, data))
    return out


_MASK = (1 << 62) - 1


def _shape(n: int, args: list, sig: list) -> int:
    """One level of structure: a hash of a node's signature and its arguments' signatures
    (the compiled pass computes the same number; a collision only cuts an instance early)."""
    h = sig[n] + 2
    for a in args[n]:
        h = (h * 1000003 + sig[a] + 2) & _MASK
    return h


def _shape2(n: int, args: list, sig: list) -> int:
    """Two levels of structure: a hash of a node's one-level hash and its arguments' (so
    that LSTM's i*u, a product of a logistic and a tanh of a gate slice, is not taken for
    h = o*tanh(c), a product of a logistic and a tanh of the cell state)."""
    h = _shape(n, args, sig) + 2
    for a in args[n]:
        h = (h * 1000003 + _shape(a, args, sig) + 2) & _MASK
    return h


def _instance_key(ms: list, args: list, sig: list, ops: list, data: list) -> tuple:
    """The canonical key of one instance, a flat tuple: per member its signature id, its
    number of arguments and where each comes from (a member position, or the k-th distinct
    outside input as -1-k); with its outside inputs and per-node data."""
    pos: dict = {}
    ext: dict = {}
    key = []
    slots = []
    for idx, n in enumerate(ms):
        pos[n] = idx
        a_n = args[n]
        key.append(sig[n])
        key.append(len(a_n))
        for a in a_n:
            p = pos.get(a)
            if p is None:
                e = ext.get(a)
                if e is None:
                    e = ext[a] = len(ext)
                p = -1 - e
            key.append(p)
        if ops[n].uses_data:
            slots.append(data[n])
    return tuple(key), list(ext), tuple(slots)
