/* dynagraph._bookkeeping: module definition (see bookkeeping.h). */
#include "bookkeeping.h"
#include "backward_batch.h"  /* dg_outer_product, dg_outer_add */

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))dg_##name, METH_FASTCALL, doc}

static PyMethodDef functions[] = {
    {"plain_expression_type", dg_plain_expression_type, METH_O,
     "plain_expression_type(cls): Expression as a type whose instances are not GC objects (expr_recorder.c)."},
    {"untrack_record", dg_untrack_record_py, METH_O,
     "untrack_record(r): a forward record and its lists untracked by the collector where they hold nothing "
     "tracked (executor.c)."},
    {"configure", dg_configure, METH_VARARGS,
     "configure(Expression, IndexSlot, RANDOM_KEY[, shapes]): the Python classes the recorder creates and checks, and the shared shape cache (recording.SHAPES)."},
    {"configure_leaves", dg_configure_leaves, METH_VARARGS,
     "configure_leaves(fallback, graph_state, lookup_op): expression_of's Python twin, the ContextVar of the "
     "current graph and the lookup op."},
    FAST(columns, "columns(args, nodes): the batch's argument columns, tuple(zip(*[args[n] for n in nodes]))."),
    FAST(place, "place(blk, row, nodes, bid): blk[n] = bid, row[n] = r for the r-th node."),
    FAST(locate, "locate(blk, row, ids): (1, b, r0) | (2, b, rows) | (3, blks, rows); see executor.gather."),
    FAST(run_batch_native, "run_batch_native(ctx, nodes): executor.run_batch for one batch; see batch_run.c."),
    FAST(compile_program, "compile_program(blocks, executed, plan, base, first): replay_native's program from "
                          "one evaluation's records, or None; see replay.c."),
    FAST(replay_native, "replay_native(ctx, program): a replayed schedule's batches as one call; see replay.c."),
    FAST(set_direct_kernels, "set_direct_kernels(18 addresses): the kernels run_batch_native calls directly; "
                             "see batch_run.c and backends/cpu/direct.py."),
    FAST(backward_batch_native, "backward_batch_native(ctx, record): autodiff.backward's step for one "
                                "ExecutedBatch; see backward_batch.c."),
    FAST(backward_batches_native, "backward_batches_native(ctx, records, end, record_type): backward_batch_native "
                                  "for records[end - 1], records[end - 2], ... while each is a record_type; where "
                                  "it stopped. See backward_batch.c."),
    FAST(outer_product, "outer_product(out, g, x): out = g^T x for one row g and x (a one-row weight gradient)."),
    FAST(outer_add, "outer_add(grad, g, x): grad += g^T x for one row g and x (a one-row weight gradient, added "
                    "straight into a parameter's gradient)."),
    FAST(add_arrays, "add_arrays(dsts, srcs): dsts[k] += srcs[k] for pairs of contiguous float arrays (parameters' "
                     "gradients), all checked first."),
    FAST(any_true, "any_true(flags, ids): whether flags[i] is True for some i in ids."),
    FAST(same_slice, "same_slice(items, lo, was): items[lo:lo + len(was)] == was; see schedule_cache.py."),
    FAST(run_table, "run_table(blk, row, args, needs_grad, steps, blocks, offs, reach, format): where a run "
                    "reads its arguments; see dynagraph/runs.py."),
    FAST(block_table, "block_table(arrays, shapes, format, writable, avoid): the row movers' checked block "
                      "addresses, or None; see run_tables.c."),
    FAST(row_index_small, "row_index_small(blocks, blks, rows): the cpu row index of a few int rows, or None; "
                          "see run_tables.c."),
    FAST(place_steps, "place_steps(blk, row, shape, steps, blocks, empty, dtype, format): a run's output "
                      "blocks made and its nodes placed; (addresses, row counts). See run_tables.c."),
    FAST(addresses, "addresses(arrays, format): int64 data address of each C-contiguous array (0 for None)."),
    FAST(grad_addresses, "grad_addresses(grads, values, format[, pair_slot, pair_off]): checked gradient block "
                         "addresses, or per-pair row addresses; see dynagraph/runs.py."),
    FAST(pending, "pending(blk, lo, hi): [i for i in range(lo, hi) if blk[i] < 0]."),
    FAST(depth_batches, "depth_batches(depth, sig, batchable, nodes): the depth scheduler's batches, or None."),
    FAST(node_arrays, "node_arrays(args, sig, depth, lo, n): (counts, flat args - lo, sig, depth) as raw buffers."),
    FAST(agenda_batches, "agenda_batches(args, sig, depth, batchable, cost, nodes): the agenda scheduler's batches, or None."),
    FAST(typewise_batches, "typewise_batches(args, sig, batchable, nodes, policy): (batches, hits, misses) of "
                           "the typewise heuristic (policy None) or the FSM, or None."),
    FAST(merge_batches, "merge_batches(batches, args, sig, batchable): the schedule with each batch joined to the "
                        "latest later batch of its signature before its first user; see batch_merge.c."),
    FAST(users_split, "users_split(args, tainted, nodes): (run, left) of dy.phase's split; see phase_split.c."),
    FAST(needed_within, "needed_within(args, within, targets): graph.needed_within; see phase_split.c."),
    FAST(array_view_state, "array_view_state(): 1 once a direct numpy view matched the buffer protocol, "
                           "-1 when it did not (views go through the protocol), 0 before the first; see array_view.c."),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dynagraph._bookkeeping",
    "The graph's per-node bookkeeping in C; each function has a pure-Python twin (see bookkeeping.h).",
    -1, functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__bookkeeping(void) {
    PyObject *m = PyModule_Create(&module);
    /* the recorder's types (GraphBase; ExprBase, Recorder), then leaves.c's expression_of, which uses them */
    if (m && (dg_recorder_add_types(m) < 0 || dg_graph_leaves_add() < 0 || dg_expr_add_types(m) < 0
              || dg_leaves_add(m) < 0 || dg_block_pool_add_type(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
