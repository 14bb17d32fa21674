/* One scheduled batch run by one C call (part of dynagraph._bookkeeping; see bookkeeping.h).

executor.run_batch is the reference: argument columns, where each column's values are
(a parameter's block, a slice of one block, or a gather), the kernel call, the output
block, the nodes' (block, row) and the ExecutedBatch record. Per sentence most batches
hold one node and that Python cost, about 5 us a batch, was as large as the kernel's.
run_batch_native does the same steps here; what is not a common case goes back to
Python through the callables in its context (a gather, an output that needs a reshape,
a cast or a broadcast), so every case still ends in exactly the reference's state.

The context (executor._native_context builds it once per evaluation) is a tuple:
   0 op      1 blk     2 row     3 args     4 blocks   5 attrs   6 data   7 shape
   8 executed (lists of the graph, mutated in place)
   9 infos: dict op -> (leaf, uses_data, saves_ctx, inner_kernels, kernel, name[, direct, splittable])
  10 info_fn(op): makes and stores an op's info
  11 xp    12 gather_fn(ids, k, op) -> (x, plan): argument k of a batch of op, gathered
  13 finish_fn(y, nodes) -> the output block
  14 ExecutedBatch (a tuple subclass)    15 ndarray (the exact type of a ready output)
  16 format of the graph's dtype ('f' or 'd')    17 batch_log (list or None)
  18 acc: bytearray of 7 doubles the caller adds to stats at the end (kernel_calls,
     batches, nodes, t_memory, t_execute, gathers, gather_bytes)
  19 dtypes: (numpy.dtype float32, float64), 20 numpy.empty (the output of a direct kernel)
  21 split_max (executor.SPLIT_MAX): a batch of at most this many nodes whose op has a direct
     kernel runs node by node when one of its argument columns would need a gather
  22 group_max (executor.GROUP_MAX): a larger one runs as one batch per source block when such a
     column's rows come from at most this many blocks (executor._block_groups)
  23 index_of: (row index type, numpy.frombuffer, numpy int64 dtype), what column_gather.c makes
     the backend's checked row index from (its direct kernels' row_index_maker), or None: every
     gather is gather_fn's
  24 transposed: a dict for the evaluation (direct_products.c keeps each shared weight it
     transposes there, keyed by address), or None: made again for every product
  25 graph: the ComputationGraph, whose node table (node_table.c) gives the argument columns
     without reading the tuples; anything else (None): they are read from args

An op's info may carry a 7th, 8th and 9th item: a direct kernel's descriptor (kind, opcode, bound for
float32, bound for float64; backends/cpu/direct.py): where every argument passes the
checks of direct_batch below, the kernel registered by set_direct_kernels is called
through its pointer instead of the op's Python kernel (info[4], which is the same
decision and the same kernel through cffi: both paths leave identical values); the kinds
are in direct_batch.c. The 8th (0, 1 or 2: never, always, for vectors): whether a small batch of
the op may run node by node (split_max below). The 9th: the op's OpDef.rows_args where the
backend reads rows in place (else ()): such a column of per-node matrices goes to gather_fn, which
leaves it in place; every other TAKE or MANY column is gathered here (column_gather.c).
*/
#include <time.h>

#include "batch_run.h"
#include "recorder.h"  /* the node table */

double dg_now(void) {  /* bookkeeping.h */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  /* time.perf_counter's clock on Linux */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether y is already the batch's block: an exact ndarray, C-contiguous, of the graph's dtype
   and shape (B,) + shape. Anything else goes through finish_fn (broadcast, reshape, cast). */
static int ready(PyObject *ctx, PyObject *y, Py_ssize_t B, PyObject *shape) {
    if (Py_TYPE(y) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, C_NDARRAY) || !PyTuple_CheckExact(shape))
        return 0;
    Py_buffer v;
    if (dg_get_buffer(y, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *want = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, C_FORMAT));
    Py_ssize_t k = PyTuple_GET_SIZE(shape);
    int ok = want && v.format && !strcmp(v.format, want) && v.ndim == k + 1 && v.shape[0] == B;
    for (Py_ssize_t i = 0; ok && i < k; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        ok = d == v.shape[i + 1];
    }
    PyBuffer_Release(&v);
    PyErr_Clear();
    return ok;
}

/* A tuple subclass instance (ExecutedBatch) holding items (stolen), as tuple.__new__(cls, items). */
static PyObject *record(PyObject *cls, PyObject **items, Py_ssize_t n) {
    PyTypeObject *t = (PyTypeObject *)cls;
    PyObject *r = PyType_IsSubtype(t, &PyTuple_Type) ? t->tp_alloc(t, n) : NULL;
    if (!r) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "run_batch_native: the record type must be a tuple subclass");
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(r, i, items[i]);
    return r;
}

/* Whether o is (a type, a callable, anything): the context's index_of. */
static int index_maker(PyObject *o) {
    return PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 3 && PyType_Check(PyTuple_GET_ITEM(o, 0))
           && PyCallable_Check(PyTuple_GET_ITEM(o, 1));
}

/* The arguments are (ctx, nodes) with ctx shaped as the top of this file says. 0, or -1
   with a TypeError set. */
static int check_arguments(PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 2 || (!PyTuple_CheckExact(argv[1]) && !PyList_CheckExact(argv[1]))) {
        PyErr_SetString(PyExc_TypeError, "run_batch_native(ctx: tuple, nodes: tuple or list)");
        return -1;
    }
    return dg_batch_check_context(argv[0]);
}

/* ctx is shaped as the top of this file says: 0, or -1 with a TypeError set. */
int dg_batch_check_context(PyObject *ctx) {
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != C_SIZE) {
        PyErr_SetString(PyExc_TypeError, "run_batch_native: the context must be a tuple of its items");
        return -1;
    }
    for (int i = C_OP; i <= C_EXECUTED; i++)
        if (!PyList_CheckExact(PyTuple_GET_ITEM(ctx, i))) {
            PyErr_Format(PyExc_TypeError, "run_batch_native: context item %d must be a list", i);
            return -1;
        }
    if (!PyDict_CheckExact(PyTuple_GET_ITEM(ctx, C_INFOS)) || !PyByteArray_CheckExact(PyTuple_GET_ITEM(ctx, C_ACC))
        || PyByteArray_GET_SIZE(PyTuple_GET_ITEM(ctx, C_ACC)) != ACC_SIZE * (Py_ssize_t)sizeof(double)
        || !PyType_Check(PyTuple_GET_ITEM(ctx, C_RECORD))
        || !PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(ctx, C_RECORD), &PyTuple_Type)
        || !PyType_Check(PyTuple_GET_ITEM(ctx, C_NDARRAY))
        || !PyUnicode_Check(PyTuple_GET_ITEM(ctx, C_FORMAT)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(ctx, C_DTYPES)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(ctx, C_DTYPES)) != 2
        || !PyCallable_Check(PyTuple_GET_ITEM(ctx, C_EMPTY)) || !PyLong_CheckExact(PyTuple_GET_ITEM(ctx, C_SPLIT_MAX))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(ctx, C_GROUP_MAX))
        || (PyTuple_GET_ITEM(ctx, C_INDEX_OF) != Py_None && !index_maker(PyTuple_GET_ITEM(ctx, C_INDEX_OF)))
        || (PyTuple_GET_ITEM(ctx, C_TRANSPOSED) != Py_None && !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, C_TRANSPOSED)))) {
        PyErr_SetString(PyExc_TypeError, "run_batch_native: malformed context");
        return -1;
    }
    return 0;
}

/* *data: the batch's data list when the op's kernel uses it (info[1]), else left as is.
   0, or -1 with an exception set (*data NULL then). */
static int batch_data(PyObject *ctx, PyObject *info, PyObject *nodes, PyObject **data) {
    int uses_data = PyObject_IsTrue(PyTuple_GET_ITEM(info, 1));
    if (uses_data <= 0)
        return uses_data;
    Py_SETREF(*data, dg_pick_list(PyTuple_GET_ITEM(ctx, C_DATA), nodes));
    return *data ? 0 : -1;
}


/* The op's kernel, info[4](xp, attrs, data, *xs): its output y (a new reference), or NULL
   on error. A saves_ctx op returns (y, ctx): *kctx takes the ctx. *t1: when the call began. */
static PyObject *call_kernel(PyObject *ctx, PyObject *info, PyObject *attrs, PyObject *data, PyObject *xs,
                             PyObject **kctx, double *t1) {
    Py_ssize_t k = PyList_GET_SIZE(xs);
    PyObject **kargv = PyMem_Malloc((size_t)(k + 3) * sizeof(PyObject *));
    if (!kargv)
        return PyErr_NoMemory();
    kargv[0] = PyTuple_GET_ITEM(ctx, C_XP);
    kargv[1] = attrs;
    kargv[2] = data;
    for (Py_ssize_t c = 0; c < k; c++)
        kargv[c + 3] = PyList_GET_ITEM(xs, c);
    Py_INCREF(attrs);
    *t1 = dg_now();
    PyObject *y = PyObject_Vectorcall(PyTuple_GET_ITEM(info, 4), kargv, (size_t)(k + 3), NULL);
    Py_DECREF(attrs);
    PyMem_Free(kargv);
    if (!y)
        return NULL;
    int saves_ctx = PyObject_IsTrue(PyTuple_GET_ITEM(info, 2));
    if (saves_ctx <= 0) {
        if (saves_ctx < 0)
            Py_CLEAR(y);
        return y;
    }
    if (!PyTuple_Check(y) || PyTuple_GET_SIZE(y) != 2) {
        PyErr_SetString(PyExc_TypeError, "run_batch_native: a saves_ctx op must return (y, ctx)");
        Py_DECREF(y);
        return NULL;
    }
    PyObject *pair = y;
    y = PyTuple_GET_ITEM(pair, 0);
    Py_SETREF(*kctx, PyTuple_GET_ITEM(pair, 1));
    Py_INCREF(y);
    Py_INCREF(*kctx);
    Py_DECREF(pair);
    return y;
}

/* *y as the batch's block: kept when ready, else replaced by finish_fn(y, nodes). 0 or -1. */
static int finish_output(PyObject *ctx, PyObject **y, PyObject *nodes, Py_ssize_t n0) {
    PyObject *shape = dg_batch_list_item(ctx, C_SHAPE, n0);
    if (!shape)
        return -1;
    if (ready(ctx, *y, PyTuple_GET_SIZE(nodes), shape))
        return 0;
    PyObject *fargv[2] = {*y, nodes};
    PyObject *fixed = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, C_FINISH), fargv, 2, NULL);
    if (!fixed)
        return -1;
    Py_SETREF(*y, fixed);
    return 0;
}

/* y appended as a new block, the nodes placed in its rows, the ExecutedBatch recorded and
   the batch logged. *xs, *plans and *kctx are stolen by the record (set to NULL). 0 or -1. */
static int place_and_record(PyObject *ctx, PyObject *info, PyObject *nodes, PyObject *cols, PyObject *y,
                            PyObject **xs, PyObject **plans, PyObject **kctx) {
    PyObject *blocks = PyTuple_GET_ITEM(ctx, C_BLOCKS);
    PyObject *bid = dg_int(PyList_GET_SIZE(blocks));
    if (!bid || PyList_Append(blocks, y) < 0) {
        Py_XDECREF(bid);
        return -1;
    }
    PyObject *pargv[4] = {PyTuple_GET_ITEM(ctx, C_BLK), PyTuple_GET_ITEM(ctx, C_ROW), nodes, bid};
    PyObject *placed = dg_place(NULL, pargv, 4);
    if (!placed) {
        Py_DECREF(bid);
        return -1;
    }
    Py_DECREF(placed);
    Py_INCREF(nodes);
    Py_INCREF(cols);
    PyObject *items[6] = {nodes, *xs, bid, *plans, cols, *kctx};
    *xs = *plans = *kctx = NULL;  /* stolen by the record */
    PyObject *rec = record(PyTuple_GET_ITEM(ctx, C_RECORD), items, 6);
    if (rec)
        dg_untrack_record(rec);  /* lives as long as the graph; holds no cycle (bookkeeping.h) */
    if (!rec || PyList_Append(PyTuple_GET_ITEM(ctx, C_EXECUTED), rec) < 0) {
        Py_XDECREF(rec);
        return -1;
    }
    Py_DECREF(rec);
    PyObject *log = PyTuple_GET_ITEM(ctx, C_LOG);
    if (PyList_CheckExact(log) && PyList_GET_SIZE(log) < 100000) {
        PyObject *entry = dg_tuple_on(PyTuple_GET_ITEM(info, 5), PyTuple_GET_SIZE(nodes));
        if (entry)
            dg_untrack_record(entry);
        int bad = !entry || PyList_Append(log, entry) < 0;
        Py_XDECREF(entry);
        if (bad)
            return -1;
    }
    return 0;
}

/* The batch's counts and times into acc: memory before the kernel (t0..t1) and after it
   (t2..now), the kernel itself (t1..t2). 0 or -1. */
static int account(PyObject *ctx, PyObject *info, Py_ssize_t B, double t0, double t1, double t2) {
    Py_ssize_t inner = PyLong_AsSsize_t(PyTuple_GET_ITEM(info, 3));
    if (inner == -1 && PyErr_Occurred())
        return -1;
    double *acc = (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, C_ACC));
    acc[ACC_KERNELS] += (double)inner;
    acc[ACC_BATCHES] += 1;
    acc[ACC_NODES] += (double)B;
    acc[ACC_MEMORY] += (t1 - t0) + (dg_now() - t2);
    acc[ACC_EXECUTE] += t2 - t1;
    return 0;
}

/* Whether the batch may run in parts (info[7]: 0 never, 1 always, 2 when the op's per-node
   value is a vector; executor._splittable): 1 or 0, -1 on error. */
static int batch_splittable(PyObject *ctx, PyObject *info, Py_ssize_t n0) {
    long splittable = PyTuple_GET_SIZE(info) >= 8 ? PyLong_AsLong(PyTuple_GET_ITEM(info, 7)) : 0;
    if (splittable == 2) {
        PyObject *shape0 = dg_batch_list_item(ctx, C_SHAPE, n0);
        if (!shape0)
            return -1;
        splittable = PyTuple_Check(shape0) && PyTuple_GET_SIZE(shape0) == 1;
    }
    if (PyErr_Occurred())
        return -1;
    return splittable == 1;
}

/* The parts of one scheduled batch count as that one batch: each part added a batch to acc
   (its kernel calls stay counted) and, below the log's cap, a log entry; these become the
   scheduled batch's single entry (op name, B), as the views and cg.print_batches() show it.
   `logged`: the log's length before the parts (-1: no log). 0 or -1. */
static int parts_as_one(PyObject *ctx, PyObject *log, Py_ssize_t logged, Py_ssize_t parts, Py_ssize_t B) {
    double *acc = (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, C_ACC));
    acc[ACC_BATCHES] -= (double)(parts - 1);
    if (logged < 0 || PyList_GET_SIZE(log) != logged + parts || parts < 2)
        return 0;
    PyObject *first = PyList_GET_ITEM(log, logged);
    if (!PyTuple_CheckExact(first) || PyTuple_GET_SIZE(first) != 2)
        return 0;
    PyObject *entry = dg_tuple_on(PyTuple_GET_ITEM(first, 0), B);
    if (!entry)
        return -1;
    dg_untrack_record(entry);
    int bad = PyList_SetSlice(log, logged, logged + parts, NULL) < 0 || PyList_Append(log, entry) < 0;
    Py_DECREF(entry);
    return bad ? -1 : 0;
}

/* Run the batch node by node (got == 1) or block by block (got == 2, the node groups in
   `groups`): each part reads its inputs in place (executor.run_batch). 0 or -1. */
static int run_in_parts(PyObject *ctx, PyObject *nodes, int got, PyObject *groups) {
    Py_ssize_t parts = got == 1 ? PyTuple_GET_SIZE(nodes) : PyTuple_GET_SIZE(groups);
    PyObject *log = PyTuple_GET_ITEM(ctx, C_LOG);
    Py_ssize_t logged = PyList_CheckExact(log) ? PyList_GET_SIZE(log) : -1;
    for (Py_ssize_t j = 0; j < parts; j++) {
        PyObject *part = got == 1 ? PyTuple_Pack(1, PyTuple_GET_ITEM(nodes, j)) : PyTuple_GET_ITEM(groups, j);
        if (got == 2)
            Py_INCREF(part);
        PyObject *oargv[2] = {ctx, part};
        PyObject *r = part ? dg_run_batch_native(NULL, oargv, 2) : NULL;
        Py_XDECREF(part);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    return parts_as_one(ctx, log, logged, parts, PyTuple_GET_SIZE(nodes));
}

/* The op's direct kernel (info[6]), where it has one, into *y; *t1 the kernel's start.
   1 when it ran, 0 when the op has none (or declined), -1 on error. */
static int run_direct(PyObject *ctx, PyObject *info, PyObject *xs, PyObject *data, PyObject *attrs, Py_ssize_t n0,
                      Py_ssize_t B, PyObject **y, int *is_block, double *t1) {
    if (PyTuple_GET_SIZE(info) < 8 || PyTuple_GET_ITEM(info, 6) == Py_None)
        return 0;
    *t1 = dg_now();
    PyObject *shape = dg_batch_list_item(ctx, C_SHAPE, n0);
    PyObject *dts = PyTuple_GET_ITEM(ctx, C_DTYPES);
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, C_FORMAT));
    if (!shape || !fmt)
        return -1;
    dg_direct_ctx dctx = {(PyTypeObject *)PyTuple_GET_ITEM(ctx, C_NDARRAY),
                          {PyTuple_GET_ITEM(dts, 0), PyTuple_GET_ITEM(dts, 1)}, PyTuple_GET_ITEM(ctx, C_EMPTY),
                          shape, B, !strcmp(fmt, "f") ? 0 : !strcmp(fmt, "d") ? 1 : -1, is_block,
                          PyTuple_GET_ITEM(ctx, C_TRANSPOSED) == Py_None ? NULL : PyTuple_GET_ITEM(ctx, C_TRANSPOSED)};
    return dg_direct_batch(&dctx, PyTuple_GET_ITEM(info, 6), xs, data, attrs, shape, B, y);
}

/* The batch's kernel (direct or through the backend), its output checked, placed and recorded,
   the batch accounted; t0 the batch's start. 0 or -1. */
int dg_batch_run_kernel(PyObject *ctx, PyObject *info, PyObject *nodes, Py_ssize_t n0, PyObject *cols, PyObject **xs,
                        PyObject **plans, PyObject **data, PyObject **kctx, PyObject **y, double t0) {
    Py_ssize_t B = PyTuple_GET_SIZE(nodes);
    if (batch_data(ctx, info, nodes, data) < 0)
        return -1;
    PyObject *attrs = dg_batch_list_item(ctx, C_ATTRS, n0);
    double t1 = t0;  /* set by run_direct or call_kernel */
    if (!attrs)
        return -1;
    int is_block = 0, direct = run_direct(ctx, info, *xs, *data, attrs, n0, B, y, &is_block, &t1);
    if (direct < 0)
        return -1;
    if (!direct && !(*y = call_kernel(ctx, info, attrs, *data, *xs, kctx, &t1)))
        return -1;
    if (!(direct && is_block) && finish_output(ctx, y, nodes, n0) < 0)  /* a direct output checked itself */
        return -1;
    double t2 = dg_now();
    if (place_and_record(ctx, info, nodes, cols, *y, xs, plans, kctx) < 0 || account(ctx, info, B, t0, t1, t2) < 0)
        return -1;
    return 0;
}

/* run_batch_native(ctx, nodes): executor.run_batch for one batch (see the top of this file). */
PyObject *dg_run_batch_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (check_arguments(argv, nargs) < 0)
        return NULL;
    PyObject *ctx = argv[0];
    double t0 = dg_now();
    PyObject *nodes = PySequence_Tuple(argv[1]);  /* private: nothing below can change it */
    if (!nodes)
        return NULL;
    Py_ssize_t B = PyTuple_GET_SIZE(nodes);
    PyObject *cols = NULL, *xs = NULL, *plans = NULL, *data = Py_None, *y = NULL, *kctx = Py_None, *res = NULL;
    Py_INCREF(data);
    Py_INCREF(kctx);
    if (B == 0) {
        PyErr_SetString(PyExc_ValueError, "run_batch_native: an empty batch");
        goto done;
    }
    Py_ssize_t n0 = dg_index_in(PyTuple_GET_ITEM(nodes, 0), PyList_GET_SIZE(PyTuple_GET_ITEM(ctx, C_OP)));
    if (n0 < 0)
        goto done;
    PyObject *op = PyList_GET_ITEM(PyTuple_GET_ITEM(ctx, C_OP), n0);
    Py_INCREF(op);
    PyObject *info = dg_batch_op_info(ctx, op);
    if (!info) {
        Py_DECREF(op);
        goto done;
    }
    Py_INCREF(info);  /* held: a kernel may clear the dict */
    PyObject *args = PyTuple_GET_ITEM(ctx, C_ARGS);
    const NodeTable *tab = dg_table_of(PyTuple_GET_ITEM(ctx, C_GRAPH), args, PyList_GET_SIZE(args));
    if (!(cols = dg_columns_of(args, nodes, tab)) || !(xs = PyList_New(0)) || !(plans = PyList_New(0)))
        goto done_info;
    dg_untrack_list(xs);  /* arrays and plan tuples only (bookkeeping.h: dg_untrack_record) */
    dg_untrack_list(plans);
    int splittable = batch_splittable(ctx, info, n0);
    if (splittable < 0)
        goto done_info;
    PyObject *groups = NULL;
    int got = dg_read_columns(ctx, cols, op, info, xs, plans, B > 1 && splittable, nodes, &groups);
    if (got > 0) {
        got = run_in_parts(ctx, nodes, got, groups) < 0 ? -1 : 1;
        Py_XDECREF(groups);
    }
    if (got < 0 || (got == 0 && dg_batch_run_kernel(ctx, info, nodes, n0, cols, &xs, &plans, &data, &kctx, &y, t0) < 0))
        goto done_info;
    res = Py_None;  /* run here, or in parts */
    Py_INCREF(res);
done_info:
    Py_DECREF(info);
    Py_DECREF(op);
done:
    Py_XDECREF(cols);
    Py_XDECREF(xs);
    Py_XDECREF(plans);
    Py_XDECREF(data);
    Py_XDECREF(y);
    Py_XDECREF(kctx);
    Py_DECREF(nodes);
    return res;
}
