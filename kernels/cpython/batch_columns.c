/* The argument columns of one batch run by run_batch_native (part of dynagraph._bookkeeping;
batch_run.c documents the context and is the caller).

Each column is a parameter's block, a slice of one block read in place, a gather made in C
(column_gather.c) or one left to the context's gather_fn; or, for an op whose direct kernel
allows it, the batch runs in parts (node by node, or one batch per source block) instead of
gathering (batch_run.c runs the parts). executor.run_batch and executor._gather_arg are the
reference.
*/
#include "batch_run.h"

/* The op's info tuple (borrowed from the infos dict, which the context holds), made by info_fn once. */
PyObject *dg_batch_op_info(PyObject *ctx, PyObject *op) {
    PyObject *infos = PyTuple_GET_ITEM(ctx, C_INFOS);
    PyObject *info = PyDict_GetItemWithError(infos, op);
    if (info || PyErr_Occurred())
        return info;
    PyObject *made = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, C_INFO_FN), op);
    if (!made)
        return NULL;
    int ok = PyTuple_CheckExact(made) && (PyTuple_GET_SIZE(made) == 6 || PyTuple_GET_SIZE(made) >= 8)
             && PyDict_SetItem(infos, op, made) == 0;
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "run_batch_native: info_fn must return a 6-, 8- or 9-tuple");
    Py_DECREF(made);
    return ok ? PyDict_GetItemWithError(infos, op) : NULL;
}

PyObject *dg_batch_list_item(PyObject *ctx, int which, Py_ssize_t i) {
    PyObject *l = PyTuple_GET_ITEM(ctx, which);
    if (i < 0 || i >= PyList_GET_SIZE(l)) {
        PyErr_Format(PyExc_IndexError, "run_batch_native: node %zd out of range", i);
        return NULL;
    }
    return PyList_GET_ITEM(l, i);
}

/* A parameter's block, shared by every node of the column (the signature guarantees it):
   *x the block, *plan (LEAF, b, None). Both NULL on error. */
static void leaf_column(PyObject *ctx, Py_ssize_t first, PyObject **x, PyObject **plan) {
    PyObject *blocks = PyTuple_GET_ITEM(ctx, C_BLOCKS);
    PyObject *b = dg_batch_list_item(ctx, C_BLK, first);
    if (!b)
        return;
    Py_ssize_t bi = dg_index_in(b, PyList_GET_SIZE(blocks));
    if (bi < 0)
        return;
    *x = PyList_GET_ITEM(blocks, bi);
    Py_INCREF(*x);
    *plan = dg_tuple_kab(0, b, Py_None);
}

/* The number of rows of a block (its first axis), or -1 with no error set when it has none.
   numpy's own fields where array_view.c can read them (no buffer export), else the buffer. */
static Py_ssize_t block_rows(PyObject *block) {
    Py_ssize_t shape[8];
    int nd = dg_array_dims(block, 8, shape);  /* more axes: -1, and len() below */
    if (nd >= 0)
        return nd >= 1 ? shape[0] : -1;
    Py_ssize_t n = PyObject_Length(block);  /* a device array: its len() */
    if (n < 0)
        PyErr_Clear();
    return n;
}

/* SLICE (1, b, r0): rows r0 .. r0+B-1 of block b (borrowed ints), read in place: the block itself
   when that is all of it (per sentence, nearly every argument is the one-row output of the batch
   before: the view cost more than the kernel), else a view. *x, *plan (SLICE, b, r0). Left NULL
   on error. executor.gather is the twin. */
static void slice_column(PyObject *ctx, PyObject *b, PyObject *r0, Py_ssize_t B, PyObject **x, PyObject **plan) {
    PyObject *blocks = PyTuple_GET_ITEM(ctx, C_BLOCKS);
    Py_ssize_t bi = dg_index_in(b, PyList_GET_SIZE(blocks)), start = PyLong_AsSsize_t(r0);
    if (bi < 0 || (start == -1 && PyErr_Occurred()))
        return;
    PyObject *blk_b = PyList_GET_ITEM(blocks, bi);
    Py_INCREF(blk_b);
    if (start == 0 && block_rows(blk_b) == B) {
        *x = blk_b;  /* the reference taken above */
    } else {
        PyObject *lo = dg_int(start), *hi = dg_int(start + B);
        PyObject *sl = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        *x = sl ? PyObject_GetItem(blk_b, sl) : NULL;
        Py_DECREF(blk_b);
        Py_XDECREF(sl);
    }
    *plan = *x ? dg_tuple_kab(1, b, r0) : NULL;
}

/* Anything else: gather_fn(ids, c, op) -> (x, plan). Left NULL on error. */
static void gather_column(PyObject *ctx, PyObject *ids, Py_ssize_t c, PyObject *op, PyObject **x,
                          PyObject **plan) {
    PyObject *co = PyLong_FromSsize_t(c);
    PyObject *gargv[3] = {ids, co, op};
    PyObject *got = co ? PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, C_GATHER), gargv, 3, NULL) : NULL;
    Py_XDECREF(co);
    if (got && (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2)) {
        PyErr_SetString(PyExc_TypeError, "run_batch_native: gather_fn must return (x, plan)");
        Py_CLEAR(got);
    }
    if (got) {
        *x = PyTuple_GET_ITEM(got, 0);
        *plan = PyTuple_GET_ITEM(got, 1);
        Py_INCREF(*x);
        Py_INCREF(*plan);
        Py_DECREF(got);
    }
}

/* The batch's nodes grouped by the block holding their argument in column `ids` (groups in order
   of first appearance, nodes in batch order), as a tuple of tuples; Py_None when the rows come
   from more than group_max blocks; NULL on error. executor._block_groups is the twin. */
static PyObject *block_groups(PyObject *ctx, PyObject *nodes, PyObject *ids, Py_ssize_t group_max) {
    PyObject *blk = PyTuple_GET_ITEM(ctx, C_BLK);
    Py_ssize_t B = PyTuple_GET_SIZE(nodes), n = 0;
    PyObject *keys[16], *lists[16];
    if (group_max > 16)
        group_max = 16;
    PyObject *out = NULL;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_index_in(PyTuple_GET_ITEM(ids, j), PyList_GET_SIZE(blk));
        if (i < 0)
            goto fail;
        PyObject *b = PyList_GET_ITEM(blk, i);
        Py_ssize_t g = 0;
        for (; g < n; g++) {
            int same = PyObject_RichCompareBool(keys[g], b, Py_EQ);
            if (same < 0)
                goto fail;
            if (same)
                break;
        }
        if (g == n) {
            if (n == group_max) {
                out = Py_None;
                Py_INCREF(out);
                goto done;
            }
            if (!(lists[n] = PyList_New(0)))
                goto fail;
            keys[n++] = b;
        }
        if (PyList_Append(lists[g], PyTuple_GET_ITEM(nodes, j)) < 0)
            goto fail;
    }
    if (!(out = PyTuple_New(n)))
        goto fail;
    for (Py_ssize_t g = 0; g < n; g++) {
        PyObject *t = PyList_AsTuple(lists[g]);
        if (!t) {
            Py_CLEAR(out);
            goto fail;
        }
        PyTuple_SET_ITEM(out, g, t);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    for (Py_ssize_t g = 0; g < n; g++)
        Py_DECREF(lists[g]);
    return out;
}

/* Whether column c of a batch of the op (info) is left in place by gather_fn: the op reads it so
   (info[8], OpDef.rows_args) and its nodes' values are matrices (a vector gains nothing: its
   copy is the cheap part). executor._gather_arg is the twin. 1, 0, -1 on error. */
static int in_place_column(PyObject *ctx, PyObject *info, Py_ssize_t c, Py_ssize_t first) {
    if (PyTuple_GET_SIZE(info) < 9)
        return 0;
    PyObject *rows_args = PyTuple_GET_ITEM(info, 8);
    int reads = rows_args == Py_True;
    if (!reads && PyTuple_CheckExact(rows_args))
        for (Py_ssize_t i = 0; !reads && i < PyTuple_GET_SIZE(rows_args); i++)
            reads = PyLong_AsSsize_t(PyTuple_GET_ITEM(rows_args, i)) == c;
    if (PyErr_Occurred())
        return -1;
    if (!reads)
        return 0;
    PyObject *shape = dg_batch_list_item(ctx, C_SHAPE, first);
    if (!shape)
        return -1;
    return !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) >= 2;
}

/* A TAKE or MANY column gathered in C (column_gather.c): 1 made, 0 not taken, -1 error. */
static int native_gather(PyObject *ctx, PyObject *loc, PyObject **x, PyObject **plan) {
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, C_FORMAT));
    if (!fmt)
        return -1;
    int t = !strcmp(fmt, "f") ? 0 : !strcmp(fmt, "d") ? 1 : -1;
    if (t < 0)
        return 0;
    dg_gather_ctx g = {PyTuple_GET_ITEM(ctx, C_BLOCKS), (PyTypeObject *)PyTuple_GET_ITEM(ctx, C_NDARRAY),
                       PyTuple_GET_ITEM(ctx, C_EMPTY), PyTuple_GET_ITEM(PyTuple_GET_ITEM(ctx, C_DTYPES), t), fmt,
                       PyTuple_GET_ITEM(ctx, C_INDEX_OF),
                       (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, C_ACC)) + ACC_GATHERS};
    return dg_gather_column(&g, loc, x, plan);
}

/* A column that is not a slice: loc is dg_locate_ids' TAKE or MANY. Gathered into *x and *plan
   (left NULL on error), 0; or, with may_split, 1 or 2 (*groups) when the batch runs in parts; -1 on
   error. */
static int located_column(PyObject *ctx, PyObject *loc, PyObject *ids, Py_ssize_t c, PyObject *op, PyObject *opinfo,
                          int may_split, PyObject *nodes, PyObject **groups, Py_ssize_t first, PyObject **x,
                          PyObject **plan) {
    if (may_split) {
        if (PyTuple_GET_SIZE(ids) <= PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, C_SPLIT_MAX)))
            return 1;
        if (PyLong_AsLong(PyTuple_GET_ITEM(loc, 0)) == 3) {  /* MANY */
            PyObject *g = block_groups(ctx, nodes, ids, PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, C_GROUP_MAX)));
            if (!g || g != Py_None) {
                *groups = g;
                return g ? 2 : -1;
            }
            Py_DECREF(g);
        }
    }
    int in_place = in_place_column(ctx, opinfo, c, first);
    int made = in_place < 0 ? -1 : in_place ? 0 : native_gather(ctx, loc, x, plan);
    if (made == 0)
        gather_column(ctx, ids, c, op, x, plan);
    return made < 0 ? -1 : 0;
}

/* Argument column `ids` of the batch: appends its value and plan to xs and plans, 0.
   A parameter's block, a slice of one block and a gather not left in place are made here; anything else is gather_fn's,
   except with may_split (the op's direct kernel allows it): then 1, nothing appended, when the
   batch has at most split_max nodes (it runs node by node), or 2 with *groups when the rows come
   from a few blocks (it runs one batch per block). -1 on error. */
static int column(PyObject *ctx, PyObject *ids, Py_ssize_t c, PyObject *op, PyObject *opinfo, PyObject *xs,
                  PyObject *plans, int may_split, PyObject *nodes, PyObject **groups) {
    Py_ssize_t B = PyTuple_GET_SIZE(ids);
    Py_ssize_t first = dg_index_in(PyTuple_GET_ITEM(ids, 0), PyList_GET_SIZE(PyTuple_GET_ITEM(ctx, C_OP)));
    if (first < 0)
        return -1;
    PyObject *info = dg_batch_op_info(ctx, PyList_GET_ITEM(PyTuple_GET_ITEM(ctx, C_OP), first));
    if (!info)
        return -1;
    PyObject *x = NULL, *plan = NULL;
    int leaf = PyObject_IsTrue(PyTuple_GET_ITEM(info, 0));
    if (leaf < 0)
        return -1;
    if (leaf) {
        leaf_column(ctx, first, &x, &plan);
    } else {
        PyObject *b0 = NULL, *r0 = NULL, *loc = NULL;
        int sliced = dg_locate_ids(PyTuple_GET_ITEM(ctx, C_BLK), PyTuple_GET_ITEM(ctx, C_ROW), ids, &b0, &r0, &loc);
        if (sliced < 0)
            return -1;
        if (sliced) {  /* read in place: no location tuple (held: making the view may run Python code) */
            slice_column(ctx, b0, r0, B, &x, &plan);
            Py_DECREF(b0);
            Py_DECREF(r0);
        } else {
            int got = located_column(ctx, loc, ids, c, op, opinfo, may_split, nodes, groups, first, &x, &plan);
            Py_DECREF(loc);
            if (got != 0)
                return got;
        }
    }
    if (plan)
        dg_untrack_record(plan);  /* ints, None and row tuples: kept with the record (bookkeeping.h) */
    int rc = x && plan && PyList_Append(xs, x) == 0 && PyList_Append(plans, plan) == 0 ? 0 : -1;
    Py_XDECREF(x);
    Py_XDECREF(plan);
    return rc;
}

/* Read the batch's argument columns into xs and plans: 0; 1 (node by node) or 2 (one batch per
   block, the node groups in *groups, a new reference) when a column asks for the batch to run in
   parts instead (batch_run.c runs them); -1 on error. */
int dg_read_columns(PyObject *ctx, PyObject *cols, PyObject *op, PyObject *info, PyObject *xs, PyObject *plans,
                    int may_split, PyObject *nodes, PyObject **groups) {
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(cols); c++) {
        int got = column(ctx, PyTuple_GET_ITEM(cols, c), c, op, info, xs, plans, may_split, nodes, groups);
        if (got != 0)
            return got;
    }
    return 0;
}
