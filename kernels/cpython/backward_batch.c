/* One executed batch's reverse step by one C call (part of dynagraph._bookkeeping; see bookkeeping.h).

autodiff.backward's loop body is the reference: whether any argument needs its gradient,
the deferred weight products, the op's backward kernel and the scatter of each argument's
gradient to the rows it was gathered from. Per sentence most batches hold one node and
that Python cost was as large as the kernel's. backward_batch_native does the same here,
with the common scatters in C (a parameter's dense gradient kept for one sum at the end,
a slice's gradient adopted as its block's or added into its rows); every other case goes
back to Python through the callables of its context, so each ends in the reference's state.

The context (autodiff._NativeBackward builds it once per backward pass) is a tuple:
   0 op   1 needs_grad   2 data   3 attrs   4 blocks (lists of the graph)
   5 gb (autodiff.Grads)   6 gb.borrowed (set)
   7 infos: dict op -> (has_backward, uses_data, saves_ctx, inner_kernels, kernel, weight_products or None,
     native code: backward_ops.c's case for the op, 0 for none, op.backward when made: an info whose
     op has another backward since is made again)
   8 info_fn(op)   9 xp   10 full (bool)
  11 defer_fn(op, xs, plans, g, need) -> need     (autodiff._defer_weight_grads)
  12 one_row_fn(plans, gxs, need, B) -> bool      (autodiff._one_row_run and its add)
  13 scatter_fn(plan, gx, B)                      (the broadcast and autodiff.scatter)
  14 leaf_sums: dict block -> list of dense parameter gradients
  15 ndarray   16 format of the graph's dtype ('f' or 'd')
  17 acc: bytearray of 5 doubles the caller adds to stats (kernel_calls, t_backward, t_memory,
     scatters, scatter_bytes)
  18 deferred: dict block -> list of (g, x), autodiff._defer_weight_grads's (done here for ndarrays)
  19 products: dict (weight_products, nargs) -> its pairs, a cache
  20 grad_block(b): block b's gradient made writable (autodiff._grad_block)
  21 row_index_type: the backend's checked row index, whose MANY scatters run here (None: none do)
  22 reduce_to (ops.base)   23 empty (np.empty)   24 dtype (the graph's)
  25 kernels: bytes, the addresses of backward_ops.c's C kernels (uint64 each; backends/cpu/backward.py)
  26 lstm_f64_max: the largest float64 LSTM batch the C kernel takes (the override's threshold)
  27 table_arrays(b): (grad, touched) of the lookup table whose value block is b, or None
  28 zeros (xp.zeros): a missing gradient block, zeroed, as autodiff._grad_block makes it
*/

#include "backward_batch.h"

static PyObject *NAME_BACKWARD;  /* "backward", interned (dg_attr) */

/* The op's info (borrowed from the infos dict), made by info_fn once. */
static PyObject *op_info(PyObject *ctx, PyObject *op) {
    PyObject *infos = PyTuple_GET_ITEM(ctx, B_INFOS);
    PyObject *info = PyDict_GetItemWithError(infos, op);
    if (info) {  /* kept across passes (autodiff._op_infos): still the op's backward? */
        PyObject *bw = dg_attr(op, &NAME_BACKWARD, "backward");
        Py_XDECREF(bw);  /* the op holds it */
        if (bw == PyTuple_GET_ITEM(info, 7))
            return info;
        PyErr_Clear();
    }
    if (PyErr_Occurred())
        return NULL;
    PyObject *made = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, B_INFO_FN), op);
    if (!made)
        return NULL;
    int ok = PyTuple_CheckExact(made) && PyTuple_GET_SIZE(made) == 8
             && PyLong_CheckExact(PyTuple_GET_ITEM(made, 6)) && PyDict_SetItem(infos, op, made) == 0;
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: info_fn must return an 8-tuple (7: an int)");
    Py_DECREF(made);
    return ok ? PyDict_GetItemWithError(infos, op) : NULL;
}


/* Whether flags[i] is True for some i in ids (autodiff's need; ids checked). */
static int any_flag(PyObject *flags, PyObject *ids) {
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ids); j++) {
        Py_ssize_t i = dg_index_in(PyTuple_GET_ITEM(ids, j), PyList_GET_SIZE(flags));
        if (i < 0)
            return -1;
        PyObject *f = PyList_GET_ITEM(flags, i);
        if (f == Py_True)
            return 1;
        if (f != Py_False) {
            Py_INCREF(f);
            int t = PyObject_RichCompareBool(f, Py_True, Py_EQ);  /* as `True in flags` */
            Py_DECREF(f);
            if (t)
                return t;
        }
    }
    return 0;
}

static int has_true(PyObject *need) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(need); k++)
        if (PyTuple_GET_ITEM(need, k) == Py_True)
            return 1;
    return 0;
}

/* need: per argument column, True when some node of it needs its gradient (every column
   in a full pass). A new tuple, or NULL with an exception set. */
static PyObject *step_need(PyObject *ctx, PyObject *cols) {
    Py_ssize_t k = PyTuple_GET_SIZE(cols);
    PyObject *need = PyTuple_New(k);
    if (!need)
        return NULL;
    int full = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, B_FULL));
    if (full < 0)
        goto fail;
    for (Py_ssize_t c = 0; c < k; c++) {
        PyObject *ids = PyTuple_GET_ITEM(cols, c);
        if (!PyTuple_CheckExact(ids) || PyTuple_GET_SIZE(ids) == 0) {
            PyErr_SetString(PyExc_TypeError, "backward_batch_native: argument columns must be tuples");
            goto fail;
        }
        int t = full ? 1 : any_flag(PyTuple_GET_ITEM(ctx, B_NEEDS), ids);
        if (t < 0)
            goto fail;
        PyObject *v = t ? Py_True : Py_False;
        Py_INCREF(v);
        PyTuple_SET_ITEM(need, c, v);
    }
    return need;
fail:
    Py_DECREF(need);
    return NULL;
}

/* The weight products of an op with some (info[5] not None): deferred to one GEMM per
   parameter, here in C where dg_defer_here can, else by defer_fn; *need loses the
   arguments deferred. 0, or -1 with an exception set. */
static int step_defer(PyObject *ctx, PyObject *info, PyObject *xs, PyObject *plans, PyObject *g, Py_ssize_t n0,
                      Py_ssize_t k, PyObject **need) {
    int here = dg_defer_here(ctx, PyTuple_GET_ITEM(info, 5), xs, plans, g, need);
    if (here)
        return here < 0 ? -1 : 0;
    PyObject *op = PyList_GET_ITEM(PyTuple_GET_ITEM(ctx, B_OP), n0);  /* n0 checked by the caller */
    PyObject *dargv[5] = {op, xs, plans, g, *need};
    Py_INCREF(op);
    PyObject *got = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_DEFER), dargv, 5, NULL);
    Py_DECREF(op);
    if (!got)
        return -1;
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != k) {
        Py_DECREF(got);
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: defer_fn must return the need tuple");
        return -1;
    }
    Py_SETREF(*need, got);
    return 0;
}

/* The op's backward kernel, info[4](xp, attrs, data, xs, y, g, need[, ctx=kctx]): its
   gradients (a new reference), or NULL with an exception set. *y gets the batch's value
   block, held for the caller to release (it outlives the scatters, as in autodiff). */
static PyObject *step_kernel(PyObject *ctx, PyObject *info, PyObject *bid, Py_ssize_t n0, PyObject *data,
                             PyObject *xs, PyObject *g, PyObject *need, PyObject *kctx, PyObject **y) {
    int saves_ctx = PyObject_IsTrue(PyTuple_GET_ITEM(info, 2));
    if (saves_ctx < 0)
        return NULL;
    PyObject *attrs_l = PyTuple_GET_ITEM(ctx, B_ATTRS), *blocks = PyTuple_GET_ITEM(ctx, B_BLOCKS);
    Py_ssize_t bi = dg_index_in(bid, PyList_GET_SIZE(blocks));
    if (bi < 0 || n0 >= PyList_GET_SIZE(attrs_l)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "backward_batch_native: node out of range");
        return NULL;
    }
    PyObject *attrs = PyList_GET_ITEM(attrs_l, n0);
    *y = PyList_GET_ITEM(blocks, bi);
    Py_INCREF(attrs);
    Py_INCREF(*y);
    PyObject *kargv[8] = {PyTuple_GET_ITEM(ctx, B_XP), attrs, data, xs, *y, g, need, kctx};
    static PyObject *ctx_name = NULL;
    if (!ctx_name && !(ctx_name = Py_BuildValue("(s)", "ctx"))) {
        Py_DECREF(attrs);
        return NULL;
    }
    PyObject *gxs = PyObject_Vectorcall(PyTuple_GET_ITEM(info, 4), kargv, 7, saves_ctx ? ctx_name : NULL);
    Py_DECREF(attrs);
    return gxs;
}

/* dy.esum(losses): one add of g into the losses' rows (autodiff._one_row_run).
   1 when one_row_fn handled the gradients, 0 when not, -1 on error. */
static int step_one_row(PyObject *ctx, PyObject *plans, PyObject *gxs, PyObject *need, Py_ssize_t B) {
    PyObject *bo = PyLong_FromSsize_t(B);
    if (!bo)
        return -1;
    PyObject *oargv[4] = {plans, gxs, need, bo};
    PyObject *done_ = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_ONE_ROW), oargv, 4, NULL);
    Py_DECREF(bo);
    if (!done_)
        return -1;
    int handled = PyObject_IsTrue(done_);
    Py_DECREF(done_);
    return handled;
}

/* Each needed argument's gradient scattered to the rows it was gathered from: in C where
   dg_scatter_here can, else by scatter_fn. *gxs becomes a fast sequence. 0 or -1. */
static int step_scatter(PyObject *ctx, PyObject *plans, PyObject **gxs, PyObject *need, Py_ssize_t k, Py_ssize_t B) {
    PyObject *fast = PySequence_Fast(*gxs, "backward_batch_native: a backward must return a sequence");
    if (!fast)
        return -1;
    Py_SETREF(*gxs, fast);
    if (PySequence_Fast_GET_SIZE(fast) < k) {
        PyErr_SetString(PyExc_IndexError, "backward_batch_native: a backward returned fewer gradients than arguments");
        return -1;
    }
    for (Py_ssize_t c = 0; c < k; c++) {
        PyObject *gx = PySequence_Fast_GET_ITEM(fast, c);
        if (PyTuple_GET_ITEM(need, c) != Py_True || gx == Py_None)
            continue;
        PyObject *plan = PyList_GET_ITEM(plans, c);
        Py_INCREF(plan);
        Py_INCREF(gx);
        int here = dg_scatter_here(ctx, plan, gx, B);
        if (here == 0) {
            PyObject *bo = PyLong_FromSsize_t(B);
            PyObject *sargv[3] = {plan, gx, bo};
            PyObject *r = bo ? PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_SCATTER), sargv, 3, NULL) : NULL;
            Py_XDECREF(bo);
            here = r ? 1 : -1;
            Py_XDECREF(r);
        }
        Py_DECREF(plan);
        Py_DECREF(gx);
        if (here < 0)
            return -1;
    }
    return 0;
}

/* After the kernel (started at t0): its time and inner kernel count into acc, then the
   gradients placed, by one row add or by scatters, their time into acc. 0 or -1. */
static int step_place(PyObject *ctx, PyObject *info, PyObject *plans, PyObject **gxs, PyObject *need, Py_ssize_t k,
                      Py_ssize_t B, double t0, double *acc) {
    double t1 = dg_now();
    Py_ssize_t inner = PyLong_AsSsize_t(PyTuple_GET_ITEM(info, 3));
    if (inner == -1 && PyErr_Occurred())
        return -1;
    acc[ACC_KERNELS] += (double)inner;
    acc[ACC_BACKWARD] += t1 - t0;
    if (k > 8) {  /* dy.esum(losses): one add of g into the losses' rows, in C where it can */
        int handled = dg_one_row_here(ctx, plans, *gxs, need, B);
        if (handled == 0)
            handled = step_one_row(ctx, plans, *gxs, need, B);
        if (handled < 0)
            return -1;
        if (handled) {
            acc[ACC_MEMORY] += dg_now() - t1;
            return 0;
        }
    }
    if (step_scatter(ctx, plans, gxs, need, k, B) < 0)
        return -1;
    acc[ACC_MEMORY] += dg_now() - t1;
    return 0;
}

/* The batch's input gradients from backward_ops.c when the op has a native code there (info[6]),
   else NULL with no exception (the op's own backward runs); NULL with an exception on error. */
static PyObject *step_native(PyObject *ctx, PyObject *info, PyObject *bid, Py_ssize_t n0, PyObject *xs, PyObject *g,
                             PyObject *need, PyObject *plans, PyObject *data) {
    long code = PyLong_AsLong(PyTuple_GET_ITEM(info, 6));
    PyObject *attrs = PyTuple_GET_ITEM(ctx, B_ATTRS), *blocks = PyTuple_GET_ITEM(ctx, B_BLOCKS);
    if (code <= 0 || n0 >= PyList_GET_SIZE(attrs))
        return NULL;
    Py_ssize_t bi = PyLong_AsSsize_t(bid);  /* the batch's output block: tanh's and logistic's backward read it */
    if (bi < 0 || bi >= PyList_GET_SIZE(blocks))
        return NULL;
    return dg_native_grads(ctx, code, PyList_GET_ITEM(attrs, n0), xs, PyList_GET_ITEM(blocks, bi), g, need, plans, data);
}

/* The gradients of one record; 0 or -1 (error). Called with the info held. */
static int step(PyObject *ctx, PyObject *rec, PyObject *info, PyObject *g, double *acc) {
    PyObject *nodes = PyTuple_GET_ITEM(rec, 0), *xs = PyTuple_GET_ITEM(rec, 1), *bid = PyTuple_GET_ITEM(rec, 2);
    PyObject *plans = PyTuple_GET_ITEM(rec, 3), *cols = PyTuple_GET_ITEM(rec, 4), *kctx = PyTuple_GET_ITEM(rec, 5);
    if (!PyTuple_CheckExact(cols) || !PyList_CheckExact(plans) || !PyList_CheckExact(xs)
        || PyList_GET_SIZE(plans) != PyTuple_GET_SIZE(cols)) {
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: a malformed ExecutedBatch");
        return -1;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(cols);
    PyObject *seq = PySequence_Tuple(nodes);
    if (!seq)
        return -1;
    Py_ssize_t B = PyTuple_GET_SIZE(seq);
    PyObject *need = NULL, *data = Py_None, *gxs = NULL, *y = NULL;
    Py_INCREF(data);
    int rc = -1;
    if (B == 0 || !(need = step_need(ctx, cols)))
        goto done;
    if (!has_true(need)) {
        rc = 0;
        goto done;
    }
    double t0 = dg_now();
    Py_ssize_t n0 = PyLong_AsSsize_t(PyTuple_GET_ITEM(seq, 0));
    if (n0 == -1 && PyErr_Occurred())
        goto done;
    if (PyTuple_GET_ITEM(info, 5) != Py_None) {  /* weight products: deferred to one GEMM per parameter */
        if (step_defer(ctx, info, xs, plans, g, n0, k, &need) < 0)
            goto done;
        if (!has_true(need)) {
            acc[ACC_BACKWARD] += dg_now() - t0;
            rc = 0;
            goto done;
        }
    }
    int uses_data = PyObject_IsTrue(PyTuple_GET_ITEM(info, 1));
    if (uses_data < 0)
        goto done;
    if (uses_data) {
        Py_SETREF(data, dg_pick_list(PyTuple_GET_ITEM(ctx, B_DATA), seq));
        if (!data)
            goto done;
    }
    if (!(gxs = step_native(ctx, info, bid, n0, xs, g, need, plans, data)) && PyErr_Occurred())
        goto done;
    if (!gxs && !(gxs = step_kernel(ctx, info, bid, n0, data, xs, g, need, kctx, &y)))
        goto done;
    rc = step_place(ctx, info, plans, &gxs, need, k, B, t0, acc);
done:
    Py_XDECREF(need);
    Py_XDECREF(data);
    Py_XDECREF(gxs);
    Py_XDECREF(y);
    Py_DECREF(seq);
    return rc;
}

/* The context's items have the types the loop body reads them as (checked once per call, so
   the body can use the unchecked macros). 0, or -1 with a TypeError. */
static int check_backward_context(PyObject *ctx) {
    for (int i = B_OP; i <= B_GB; i++)
        if (!PyList_Check(PyTuple_GET_ITEM(ctx, i))) {
            PyErr_Format(PyExc_TypeError, "backward_batch_native: context item %d must be a list", i);
            return -1;
        }
    PyObject *acc_b = PyTuple_GET_ITEM(ctx, B_ACC);
    if (!PySet_Check(PyTuple_GET_ITEM(ctx, B_BORROWED)) || !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, B_INFOS))
        || !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, B_LEAF_SUMS)) || !PyType_Check(PyTuple_GET_ITEM(ctx, B_NDARRAY))
        || !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, B_DEFERRED)) || !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, B_PRODUCTS))
        || !PyUnicode_Check(PyTuple_GET_ITEM(ctx, B_FORMAT)) || !PyByteArray_CheckExact(acc_b)
        || !PyCallable_Check(PyTuple_GET_ITEM(ctx, B_GRAD_BLOCK))
        || (PyTuple_GET_ITEM(ctx, B_ROWINDEX) != Py_None && !PyType_Check(PyTuple_GET_ITEM(ctx, B_ROWINDEX)))
        || !PyCallable_Check(PyTuple_GET_ITEM(ctx, B_REDUCE_TO)) || !PyCallable_Check(PyTuple_GET_ITEM(ctx, B_EMPTY))
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(ctx, B_KERNELS))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(ctx, B_LSTM_F64_MAX))
        || !PyCallable_Check(PyTuple_GET_ITEM(ctx, B_TABLE_ARRAYS))
        || !PyCallable_Check(PyTuple_GET_ITEM(ctx, B_ZEROS))
        || PyByteArray_GET_SIZE(acc_b) != ACC_SIZE * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: malformed context");
        return -1;
    }
    return 0;
}

/* One record's reverse step, the context checked. 0 or -1 (error). */
static int backward_one(PyObject *ctx, PyObject *rec) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 6) {
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: a record must be an ExecutedBatch");
        return -1;
    }
    PyObject *acc_b = PyTuple_GET_ITEM(ctx, B_ACC);
    PyObject *gb = PyTuple_GET_ITEM(ctx, B_GB), *nodes = PyTuple_GET_ITEM(rec, 0);
    Py_ssize_t bid = dg_index_in(PyTuple_GET_ITEM(rec, 2), PyList_GET_SIZE(gb));
    if (bid < 0)
        return -1;
    PyObject *g = PyList_GET_ITEM(gb, bid);
    if (g == Py_None)
        return 0;
    if (!PyTuple_CheckExact(nodes) && !PyList_CheckExact(nodes)) {
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: a record's nodes must be a tuple or list");
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(nodes) == 0) {
        PyErr_SetString(PyExc_ValueError, "backward_batch_native: an empty batch");
        return -1;
    }
    PyObject *ops = PyTuple_GET_ITEM(ctx, B_OP);
    Py_ssize_t n0 = dg_index_in(PySequence_Fast_ITEMS(nodes)[0], PyList_GET_SIZE(ops));
    if (n0 < 0)
        return -1;
    Py_INCREF(g);
    PyObject *op = PyList_GET_ITEM(ops, n0);
    Py_INCREF(op);
    PyObject *info = op_info(ctx, op);
    Py_DECREF(op);
    if (!info) {
        Py_DECREF(g);
        return -1;
    }
    Py_INCREF(info);
    int rc = 0;
    if (PyTuple_GET_ITEM(info, 0) == Py_True)
        rc = step(ctx, rec, info, g, (double *)PyByteArray_AS_STRING(acc_b));
    Py_DECREF(info);
    Py_DECREF(g);
    return rc;
}

/* backward_batch_native(ctx, record): autodiff.backward's loop body for one ExecutedBatch. */
PyObject *dg_backward_batch_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyTuple_CheckExact(argv[0]) || PyTuple_GET_SIZE(argv[0]) != B_SIZE
        || !PyTuple_Check(argv[1]) || PyTuple_GET_SIZE(argv[1]) != 6) {
        PyErr_SetString(PyExc_TypeError, "backward_batch_native(ctx: tuple, record: ExecutedBatch)");
        return NULL;
    }
    if (check_backward_context(argv[0]) < 0 || backward_one(argv[0], argv[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* backward_batches_native(ctx, records, end, record_type): backward_batch_native for records[end - 1],
   records[end - 2], ... while each is exactly of record_type (ExecutedBatch); the index j where it
   stopped (records[j - 1] is another kind of record, which autodiff replays itself), 0 at the start.
   One call for the whole pass of a graph of plain batches: per sentence, the Python loop around
   each record's call cost as much as a small record's step. */
PyObject *dg_backward_batches_native(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyTuple_CheckExact(argv[0]) || PyTuple_GET_SIZE(argv[0]) != B_SIZE
        || !PyList_CheckExact(argv[1]) || !PyLong_Check(argv[2]) || !PyType_Check(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "backward_batches_native(ctx: tuple, records: list, end: int, record_type)");
        return NULL;
    }
    PyObject *ctx = argv[0], *records = argv[1];
    if (check_backward_context(ctx) < 0)
        return NULL;
    Py_ssize_t j = PyLong_AsSsize_t(argv[2]);
    if (j == -1 && PyErr_Occurred())
        return NULL;
    if (j < 0 || j > PyList_GET_SIZE(records)) {
        PyErr_SetString(PyExc_IndexError, "backward_batches_native: end out of range");
        return NULL;
    }
    for (; j > 0; j--) {
        if (j > PyList_GET_SIZE(records)) {  /* a kernel's Python code shortened the list */
            PyErr_SetString(PyExc_RuntimeError, "backward_batches_native: the records changed during the pass");
            return NULL;
        }
        PyObject *rec = PyList_GET_ITEM(records, j - 1);
        if (Py_TYPE(rec) != (PyTypeObject *)argv[3])
            break;
        Py_INCREF(rec);
        int rc = backward_one(ctx, rec);
        Py_DECREF(rec);
        if (rc < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(j);
}
