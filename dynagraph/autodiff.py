"""Batched reverse mode: replay the executed batches backwards.

Each batch's output gradient is its own contiguous block; input gradients are
computed in one call per argument and scatter-added to their source rows.
Parameter gradients arrive already reduced over the batch (one GEMM); lookup
tables receive one sparse row update per batch.
"""
from __future__ import annotations

import struct
import time

import numpy as np

from .executor import LEAF, SLICE, TAKE, ExecutedBatch, any_true, pick
from .ops.base import DEFER, Sliced, SparseRows, WeightProduct, one_row, reduce_to
from .recording import NATIVE
from .runs import backward_run


class Grads(list):
    """Gradient blocks, one per value block (None until a gradient arrives).

    The first gradient that covers a whole block is adopted as it is, not added into a
    zero-filled copy: that saves a zero fill and an add pass per block (measured: most
    op-level blocks get exactly one full contribution). An adopted array may be shared
    (an op's backward can return its output gradient unchanged for two arguments), so it
    is copy-on-write: `_grad_block` copies it before the first add into it. `zeros(shape,
    dtype)` makes a zero-filled block: the backend's block pool where it has one."""

    __slots__ = ("borrowed", "zeros")

    def __init__(self, n: int, zeros):
        super().__init__([None] * n)
        self.borrowed: set = set()
        self.zeros = zeros

    def adopt(self, b: int, g, shape: tuple, owned: bool) -> bool:
        """Take g as block b's gradient when b has none yet and g fits it exactly."""
        if self[b] is not None or g.shape != shape or not g.flags.c_contiguous:
            return False
        self[b] = g
        if not owned:
            self.borrowed.add(b)
        return True


def _grad_block(cg, xp, gb, b):
    g = gb[b]
    if g is None:
        g = gb[b] = gb.zeros(cg.blocks[b].shape, cg.dtype)
    elif b in gb.borrowed:
        g = gb[b] = g.copy()
        gb.borrowed.discard(b)
    return g


def scatter(cg, be, gb, plan: tuple, gx, stats, leaf_sums: dict | None = None) -> None:
    """Add gx to the rows its argument was gathered from (the forward's plan). With
    leaf_sums, a dense gradient of a parameter's block (a bias) is kept there, summed
    once per block at the end of the pass (_leaf_grads) instead of one add per batch."""
    xp = be.xp
    kind, b, rows = plan
    if kind == LEAF and leaf_sums is not None and type(gx) is not SparseRows and type(gx) is not Sliced \
            and gx.dtype == cg.dtype and gx.shape[1:] == cg.blocks[b].shape[1:]:
        leaf_sums.setdefault(b, []).append(gx)
        return
    if (kind == SLICE or kind == LEAF) and gb[b] is None and not isinstance(gx, (SparseRows, Sliced)) \
            and gx.dtype == cg.dtype:
        shape = cg.blocks[b].shape
        if kind == LEAF:  # a parameter's block: one row, the batch's rows summed (a fresh array)
            summed = gx.shape[0] != 1
            if gb.adopt(b, gx.sum(axis=0, keepdims=True) if summed else gx, shape, summed):
                return
        elif rows == 0 and gx.shape[0] == shape[0] and gb.adopt(b, gx.reshape(shape), shape, False):
            return
    if isinstance(gx, SparseRows):
        be.embedding_backward(cg.leaf_param(b), gx.idx, gx.vals)
        stats.scatters += 1
        stats.scatter_bytes += gx.vals.nbytes
        return
    if isinstance(gx, Sliced):
        if kind == SLICE:  # add straight into the box of the source rows
            g = _grad_block(cg, xp, gb, b)
            g[(slice(rows, rows + gx.vals.shape[0]),) + gx.index] += gx.vals
            return
        gx = gx.dense(xp)
    if kind == LEAF:
        g = _grad_block(cg, xp, gb, b)
        g += gx.sum(axis=0, keepdims=True) if gx.shape[0] != 1 else gx
        return
    if kind == SLICE:
        dst = _grad_block(cg, xp, gb, b)[rows:rows + gx.shape[0]]
        dst += gx.reshape(dst.shape)
        return
    if kind == TAKE:
        g = _grad_block(cg, xp, gb, b)
        be.add_rows(g, rows, gx.reshape((len(rows),) + g.shape[1:]))
    else:
        be.scatter_indexed(lambda bb: _grad_block(cg, xp, gb, bb), b, gx)  # b: the gather's row index
    stats.scatters += 1
    stats.scatter_bytes += gx.nbytes


def _one_row_run(cg, plans: list, gxs, need: tuple, B: int) -> bool:
    """One node whose arguments are consecutive rows of one block, all needing the same
    (1, ...) gradient (esum or average over a list of losses): one add instead of one
    scatter per argument."""
    g0 = gxs[0]
    if B != 1 or g0 is None or isinstance(g0, (SparseRows, Sliced)) or g0.shape[0] != 1 or g0.dtype != cg.dtype:
        return False
    kind, b, r0 = plans[0]
    if kind != SLICE or False in need:
        return False
    for j, (plan, gx) in enumerate(zip(plans, gxs)):
        if gx is not g0 or plan[0] != SLICE or plan[1] != b or plan[2] != r0 + j:
            return False
    return True


def _defer_weight_grads(op, xs: list, plans: list, g, need: tuple, deferred: dict) -> tuple:
    """For each product W x of the batch with W a parameter (one shared row) and x a batch
    of vectors, keep (g, x) for one GEMM per parameter at the end of the pass and drop W
    from `need`: dW = sum over every batch of g^T x. One product per parameter instead of
    one per batch, and no (rows x cols) temporary to add per batch; only the order of the
    sum over nodes changes (float rounding)."""
    if g.ndim != 2:
        return need
    out = None
    for w, x in op.weight_products(len(xs)):
        W, X = xs[w], xs[x]
        if need[w] and _shared_leaf(W, plans[w]) and X.ndim == 2 \
                and X.shape[0] == g.shape[0] and g.shape[1] == W.shape[1] and X.shape[1] == W.shape[2]:
            deferred.setdefault(plans[w][1], []).append((g, X))
            if out is None:
                out = list(need)
            out[w] = False
    return need if out is None else tuple(out)


def _shared_leaf(W, plan: tuple) -> bool:
    """W is a parameter's block read as its one shared row (1, r, c): a gradient that can be deferred."""
    return plan[0] == LEAF and W.ndim == 3 and W.shape[0] == 1


def _mark_deferred(op, attrs, xs: list, plans: list, need: tuple) -> tuple:
    """need with DEFER at each of op.deferred_weights that is a parameter's one shared row: the
    op's backward then hands that gradient back as a WeightProduct, which _scatter_arg adds to
    the deferred products (lstm_step's recurrent W_h, one product per step)."""
    out = None
    for w in op.deferred_weights(attrs, len(xs)):
        if need[w] and _shared_leaf(xs[w], plans[w]):
            if out is None:
                out = list(need)
            out[w] = DEFER
    return need if out is None else tuple(out)


def _weight_grads(cg, xp, gb: Grads, deferred: dict, leaf_sums: dict) -> None:
    """dW = G^T X over every deferred product of each parameter block: one GEMM each. A block whose
    only gradient is one one-row product (per sentence, most weights) keeps it unmultiplied, as an
    OuterBlock: _finish adds it straight into the parameter's gradient where that takes one."""
    for b, pairs in deferred.items():
        if len(pairs) == 1:
            G, X = pairs[0]
            if G.shape[0] == 1 and gb[b] is None and b not in leaf_sums:
                gb[b] = OuterBlock(G, X)
                continue
        else:
            G = xp.concatenate([p[0] for p in pairs])
            X = xp.concatenate([p[1] for p in pairs])
        if G.shape[0] == 1:  # one row (a sentence's single product): the outer product, each entry one
            gw = _outer(xp, G, X)  # rounded multiply as in the GEMM, without its call overhead
        else:
            gw = one_row(G.T @ X)
        if not gb.adopt(b, gw, cg.blocks[b].shape, True):
            _grad_block(cg, xp, gb, b)[...] += gw


_outer_product = getattr(NATIVE, "outer_product", None)
_outer_add = getattr(NATIVE, "outer_add", None)


def _outer(xp, G, X):
    """G^T X as (1, r, c) for one-row G (1, r) and X (1, c): by one C loop for contiguous numpy
    arrays of one dtype (numpy's broadcast multiply costs ~6 us at 64 x 64), else numpy's."""
    if _outer_product is not None and type(G) is np.ndarray and type(X) is np.ndarray and G.dtype == X.dtype \
            and G.dtype in _FORMAT and G.flags.c_contiguous and X.flags.c_contiguous:
        out = np.empty((1, G.shape[1], X.shape[1]), G.dtype)
        _outer_product(out, G, X)
        return out
    return one_row(G.T * X)


class OuterBlock:
    """A parameter block's gradient G^T X (one-row G and X), left unmultiplied: _finish adds it
    straight into the parameter's gradient (add_into) or, where that cannot take the arrays, as
    the (1, r, c) block (dense); `gradient()` of the parameter's node indexes its one row."""

    __slots__ = ("G", "X")

    def __init__(self, G, X):
        self.G, self.X = G, X

    def __getitem__(self, row):
        return one_row(self.G.T * self.X)[row]

    def dense(self, xp):
        return _outer(xp, self.G, self.X)

    def add_into(self, grad) -> bool:
        """grad += G^T X in one C pass: no (r, c) temporary and no second pass to add it. Each
        entry is rounded as on the dense path (a rounded product, then a rounded add). False, with
        nothing written, where the C loop cannot take the arrays (a device array, another dtype)."""
        if _outer_add is None:
            return False
        try:
            _outer_add(grad, self.G, self.X)
        except TypeError:
            return False
        return True


_RUNNING_SUM_MIN = 1 << 14  # elements: smaller parts keep the concatenated sum (its rounding, as before)


def _leaf_grads(cg, xp, gb: Grads, leaf_sums: dict) -> None:
    """Each parameter block's deferred dense gradients (one (B, ...) array per batch), summed
    over every row of every batch in one reduction and added to (or adopted as) its block."""
    for b, parts in leaf_sums.items():
        if len(parts) == 1 and parts[0].shape[0] == 1:  # one row is its own sum (per sentence, most biases):
            total, owned = parts[0], False             # borrowed, as it may be another block's gradient
        elif parts[0].size >= _RUNNING_SUM_MIN and all(p.shape[0] == 1 for p in parts):
            # large and already one row each (a dy.block plan's weight gradient per call, MBs at
            # H=256): a running sum reads each once, where concatenating first copied them all
            total, owned = parts[0] + parts[1], True
            for p in parts[2:]:
                total += p
        else:
            total, owned = (parts[0] if len(parts) == 1 else xp.concatenate(parts)).sum(axis=0, keepdims=True), True
        if not gb.adopt(b, total, cg.blocks[b].shape, owned):
            _grad_block(cg, xp, gb, b)[...] += total


_backward_native = getattr(NATIVE, "backward_batch_native", None)  # None: the Python reference runs
_backward_batches = getattr(NATIVE, "backward_batches_native", None)  # built with it, in the same module
_FORMAT = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}
_ACC = ("kernel_calls", "t_backward", "t_memory", "scatters", "scatter_bytes")  # backward_batch_native's accumulator
_UNPACK_ACC = struct.Struct("5d").unpack  # its five doubles, in _ACC's order
_PRODUCTS: dict = {}  # (weight_products, number of arguments) -> its pairs, for backward_batch_native


class _NativeBackward:
    """_batch_step for every ExecutedBatch of one pass through _bookkeeping.backward_batch_native
    (kernels/cpython/backward_batch.c, which documents the context); anything it does not do
    itself comes back to the Python functions below, so both paths end in the same state."""

    def __init__(self, cg, be, gb: Grads, full: bool, deferred: dict, leaf_sums: dict):
        xp, stats, nb, pool = be.xp, cg.stats, be.native_backward, be.block_pool
        self.acc = bytearray(8 * len(_ACC))
        self.stats = stats

        def one_row(plans, gxs, need, B):
            return _one_row_add(cg, xp, gb, plans, gxs, need, B, stats)

        def scatter_one(plan, gx, B):
            _scatter_arg(cg, be, gb, plan, gx, B, stats, leaf_sums, deferred)

        self.ctx = (cg.op, cg.needs_grad, cg.data, cg.attrs, cg.blocks, gb, gb.borrowed, _op_infos(be),
                    lambda op: (op.backward is not None, op.uses_data, op.saves_ctx, op.inner_kernels,
                                be.backward_kernels.get(op.name, op.backward), op.weight_products,
                                nb.code(op, be.backward_kernels) if nb is not None else 0, op.backward),
                    xp, bool(full), lambda op, xs, plans, g, need: _defer_weight_grads(op, xs, plans, g, need, deferred),
                    one_row, scatter_one, leaf_sums, np.ndarray, _FORMAT.get(np.dtype(cg.dtype), ""), self.acc,
                    deferred, _PRODUCTS, lambda b: _grad_block(cg, xp, gb, b),
                    nb.row_index_type if nb is not None else None, reduce_to, pool.empty if pool is not None else xp.empty, np.dtype(cg.dtype),
                    nb.kernels if nb is not None else b"", nb.lstm_f64_max if nb is not None else 0,
                    lambda b: _table_arrays(cg.leaf_param(b)), gb.zeros)

    def close(self) -> None:
        """The accumulator into stats, unrolled: this runs once per backward() of every small graph
        (a loop over the names with getattr/setattr cost ~4 us a sentence)."""
        kernels, t_backward, t_memory, scatters, scatter_bytes = _UNPACK_ACC(self.acc)
        stats = self.stats
        if kernels:
            stats.kernel_calls += int(kernels)
        stats.t_backward += t_backward
        stats.t_memory += t_memory
        if scatters:
            stats.scatters += int(scatters)
            stats.scatter_bytes += int(scatter_bytes)


_INFOS: dict = {}  # backend -> (its backward_kernels and native_backward when made, {op: its info})


def _op_infos(be) -> dict:
    """backward_batch_native's per-op infos, kept across passes while the backend's backward
    kernels and native_backward stay what they were (per sentence, six info calls a pass)."""
    kept = _INFOS.get(be)
    if kept is None or kept[1] is not be.native_backward or kept[0] != be.backward_kernels:
        kept = _INFOS[be] = (dict(be.backward_kernels), be.native_backward, {})
    return kept[2]


def _table_arrays(p):
    """(grad, touched) of a lookup table, what backend.embedding_backward adds into; None otherwise."""
    return (p.grad, p.touched) if p.is_lookup else None


def _one_row_add(cg, xp, gb, plans: list, gxs, need: tuple, B: int, stats) -> bool:
    """dy.esum(losses): one add of g into the losses' rows, where _one_row_run says it fits."""
    if not _one_row_run(cg, plans, gxs, need, B):
        return False
    _, b, r0 = plans[0]
    _grad_block(cg, xp, gb, b)[r0:r0 + len(plans)] += gxs[0]
    stats.scatters += 1
    stats.scatter_bytes += gxs[0].nbytes * len(plans)
    return True


def _scatter_arg(cg, be, gb, plan: tuple, gx, B: int, stats, leaf_sums: dict, deferred: dict) -> None:
    """One argument's gradient to its rows: a shared row is broadcast to the batch first; a
    parameter's WeightProduct (only ever asked for a shared leaf: _mark_deferred) joins the
    deferred products."""
    if type(gx) is WeightProduct:
        deferred.setdefault(plan[1], []).append((gx.G, gx.X))
        return
    if plan[0] != LEAF and not isinstance(gx, (SparseRows, Sliced)) and gx.shape[0] != B:
        gx = be.xp.broadcast_to(gx, (B,) + gx.shape[1:])
    scatter(cg, be, gb, plan, gx, stats, leaf_sums)


def backward(cg, be, nid: int, full: bool = False) -> None:
    stats = cg.stats
    xp = be.xp
    pool = be.block_pool
    gb = Grads(len(cg.blocks), pool.zeros if pool is not None else xp.zeros)
    seed = _grad_block(cg, xp, gb, cg.blk[nid])
    seed[cg.row[nid]] = 1
    grad_block = lambda b: _grad_block(cg, xp, gb, b)  # noqa: E731
    deferred: dict = {}  # parameter block -> [(g, x), ...] of its products, summed at the end
    leaf_sums: dict = {}  # parameter block -> [its dense gradient per batch], summed at the end
    native = _NativeBackward(cg, be, gb, full, deferred, leaf_sums) if _backward_native is not None else None
    records = cg.executed
    try:
        if native is not None:
            end = len(records)  # stretches of plain batches in one C call each, anything else here
            while end:
                end = _backward_batches(native.ctx, records, end, ExecutedBatch)
                if end:
                    end -= 1
                    _other_record(cg, be, gb, records[end], full, grad_block, deferred)
        else:
            for record in reversed(records):
                if type(record) is ExecutedBatch:
                    _batch_step(cg, be, gb, record, full, deferred, leaf_sums)
                else:
                    _other_record(cg, be, gb, record, full, grad_block, deferred)
    finally:
        if native is not None:
            native.close()
    _finish(cg, be, gb, deferred, leaf_sums)


def _other_record(cg, be, gb: Grads, record, full: bool, grad_block, deferred: dict) -> None:
    """A record that is not one batch: a coarsened group (dynagraph/coarsen) replays itself
    (its weight products join `deferred`); anything else is a run of elementwise batches (runs.py)."""
    if hasattr(record, "grad"):
        record.grad(cg, be, gb, full, grad_block, deferred)
    else:
        backward_run(cg, be, gb, record, full, grad_block)


def _batch_step(cg, be, gb: Grads, record: ExecutedBatch, full: bool, deferred: dict, leaf_sums: dict) -> None:
    """The reference reverse step of one batch (backward_batch_native is its compiled twin)."""
    nodes, xs, bid, plans, cols, ctx = record
    g = gb[bid]
    n0 = nodes[0]
    op = cg.op[n0]
    if g is None or op.backward is None:
        return
    if full:
        need = (True,) * len(cols)
    else:
        need = tuple([any_true(cg.needs_grad, ids) for ids in cols])
        if True not in need:
            return
    stats, xp = cg.stats, be.xp
    t0 = time.perf_counter()
    if op.deferred_weights is not None:
        need = _mark_deferred(op, cg.attrs[n0], xs, plans, need)
    if op.weight_products is not None:
        need = _defer_weight_grads(op, xs, plans, g, need, deferred)
        if True not in need:
            stats.t_backward += time.perf_counter() - t0
            return
    data = list(pick(cg.data, nodes)) if op.uses_data else None
    bw = be.backward_kernels.get(op.name, op.backward)
    if op.saves_ctx:
        gxs = bw(xp, cg.attrs[n0], data, xs, cg.blocks[bid], g, need, ctx=ctx)
    else:
        gxs = bw(xp, cg.attrs[n0], data, xs, cg.blocks[bid], g, need)
    t1 = time.perf_counter()
    stats.kernel_calls += op.inner_kernels
    stats.t_backward += t1 - t0
    if len(plans) > 8 and _one_row_add(cg, xp, gb, plans, gxs, need, len(nodes), stats):
        stats.t_memory += time.perf_counter() - t1
        return
    for k, plan in enumerate(plans):
        if need[k] and gxs[k] is not None:
            _scatter_arg(cg, be, gb, plan, gxs[k], len(nodes), stats, leaf_sums, deferred)
    stats.t_memory += time.perf_counter() - t1


def _finish(cg, be, gb: Grads, deferred: dict, leaf_sums: dict) -> None:
    """The deferred parameter gradients, then every parameter's gradient from its block."""
    stats, xp = cg.stats, be.xp
    if deferred or leaf_sums:
        t0 = time.perf_counter()
        _weight_grads(cg, xp, gb, deferred, leaf_sums)
        _leaf_grads(cg, xp, gb, leaf_sums)
        stats.t_backward += time.perf_counter() - t0
    needs_grad, blk = cg.needs_grad, cg.blk
    dsts, srcs = [], []
    for leaf in cg._leaves.values():
        g = gb[blk[leaf]]
        if g is not None and needs_grad[leaf]:
            p = cg.leaf_param(blk[leaf])
            if type(g) is OuterBlock:
                if not p.is_lookup and g.add_into(p.grad):
                    continue
                g = g.dense(xp)
            dsts.append(p.grad)  # added in place: the same array, so not stored back through the attribute
            srcs.append(g)
            if p.is_lookup:
                p.touched[:] = True  # dense use: every row has a gradient (DyNet's all_updated)
    _add_grads(dsts, srcs)
    cg.grad_blocks = gb


_add_arrays = getattr(NATIVE, "add_arrays", None)


def _add_grads(dsts: list, srcs: list) -> None:
    """grad += g[0] for each parameter's gradient and its (1, ...) gradient block: one C call for
    them all where every pair is a contiguous host array of one float dtype and shape (per
    sentence: about ten numpy adds of ~1 us each), else numpy's add per pair."""
    if _add_arrays is not None and dsts:
        try:  # it checks every pair (host buffer, layout, dtype, size) before it adds any
            _add_arrays(dsts, srcs)
            return
        except TypeError:  # a device array, another dtype or layout: nothing was added
            pass
    for grad, g in zip(dsts, srcs):
        grad += g[0]
