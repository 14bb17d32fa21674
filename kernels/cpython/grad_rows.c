/* The backward step's row scatters that write into gradient blocks made on demand (part of
dynagraph._bookkeeping; backward_batch.c documents the context, grad_scatter.c does the scatters
that need no new block).

  dg_scatter_many: a gathered argument's gradient (plan (MANY, row index, None)) added into the
      rows it was gathered from, across several gradient blocks: autodiff.scatter's MANY case
      (be.scatter_indexed), per sentence the commonest scatter of all (every LSTM step's input
      is gathered from a dozen blocks), its Python cost ten times the adds.
  dg_writable_grad: block b's gradient made writable (autodiff._grad_block: a zero block when
      there is none, made here by xp.zeros, a copy when it is borrowed, by the context's grad_block).

Only the backend's own checked row index is read here (its type is the context's B_ROWINDEX,
the native_backward capability's row_index_type; None: every MANY scatter goes back to
Python): its rows were checked against the shapes it keeps, and each target block is checked
to have that shape before a row is written. */
#include "backward_batch.h"

static PyObject *NAME_SHAPE, *NAME_IDS, *NAME_SHAPES, *NAME_LOCAL, *NAME_ROWS;  /* interned (dg_attr) */

/* Block b's gradient, writable (a new reference), or NULL with an exception set. The owned
   case is read here; a missing or borrowed one is made by grad_block (Python). */
PyObject *dg_writable_grad(PyObject *ctx, Py_ssize_t b) {
    PyObject *gb = PyTuple_GET_ITEM(ctx, B_GB);
    if (b < 0 || b >= PyList_GET_SIZE(gb)) {
        PyErr_SetString(PyExc_IndexError, "backward_batch_native: gradient block out of range");
        return NULL;
    }
    PyObject *g = PyList_GET_ITEM(gb, b), *bkey = dg_int(b);
    if (!bkey)
        return NULL;
    int borrowed = g == Py_None ? 1 : PySet_Contains(PyTuple_GET_ITEM(ctx, B_BORROWED), bkey);
    PyObject *out = NULL;
    if (borrowed == 0) {
        out = g;
        Py_INCREF(out);
    } else if (g == Py_None) {  /* _grad_block's zero block, xp.zeros(block.shape, dtype), with no frame */
        PyObject *blocks = PyTuple_GET_ITEM(ctx, B_BLOCKS);
        PyObject *shape = b < PyList_GET_SIZE(blocks) ? dg_attr(PyList_GET_ITEM(blocks, b), &NAME_SHAPE, "shape")
                                                      : NULL;
        if (shape) {
            PyObject *argv[2] = {shape, PyTuple_GET_ITEM(ctx, B_DTYPE)};
            out = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_ZEROS), argv, 2, NULL);
            Py_DECREF(shape);
            if (out && PyList_SetItem(gb, b, Py_NewRef(out)) < 0)  /* gb holds it; b checked above */
                Py_CLEAR(out);
        } else if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_IndexError, "backward_batch_native: value block out of range");
        }
    } else if (borrowed > 0) {
        out = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, B_GRAD_BLOCK), bkey);
    }
    Py_DECREF(bkey);
    return out;
}

/* An int64 vector attribute of the row index (its buffer held in v), or 0 when it is not one. */
static int int64_vector(PyObject *ix, PyObject **interned, const char *name, Py_buffer *v) {
    PyObject *a = dg_attr(ix, interned, name);
    if (!a) {
        PyErr_Clear();
        return 0;
    }
    int ok = dg_get_buffer(a, v, PyBUF_RECORDS_RO) == 0;
    Py_DECREF(a);  /* the buffer keeps the array alive */
    if (!ok) {
        PyErr_Clear();
        return 0;
    }
    if (v->ndim != 1 || v->itemsize != 8 || !v->format || (strcmp(v->format, "l") && strcmp(v->format, "q"))
        || v->strides[0] != 8) {
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

/* The checked target of one block: a writable C-contiguous array of the graph's dtype whose
   shape is `shape` (the row index's record of it). Its buffer in t; 1 ok, 0 not ours. */
static int target_view(PyObject *ctx, PyObject *g, PyObject *shape, const char *fmt, Py_buffer *t) {
    if (Py_TYPE(g) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY) || !PyTuple_CheckExact(shape))
        return 0;
    if (dg_get_buffer(g, t, PyBUF_RECORDS) < 0) {  /* writable */
        PyErr_Clear();
        return 0;
    }
    int fits = t->format && !strcmp(t->format, fmt) && t->ndim == PyTuple_GET_SIZE(shape);
    Py_ssize_t step = t->itemsize;
    for (int i = t->ndim - 1; fits && i >= 0; i--) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        fits = s == t->shape[i] && (t->shape[i] <= 1 || t->strides[i] == step);
        step *= t->shape[i];
    }
    PyErr_Clear();
    if (!fits)
        PyBuffer_Release(t);
    return fits;
}

/* Whether the target t (contiguous) and x's rows (`xspan` bytes from x->buf) share memory. */
static int overlaps(const Py_buffer *t, const Py_buffer *x, Py_ssize_t xspan) {
    const char *a0 = t->buf, *b0 = x->buf;
    return a0 < b0 + xspan && b0 < a0 + t->len;
}

/* The adds themselves: row j of x (rows `stride` bytes apart) into row rows[j] of target
   local[j]; in row order, so repeated rows sum in the order of the reference's kernel.
   1 done, 0 an index out of range (not ours). */
static int add_rows_into(Py_buffer *targets, Py_ssize_t nt, const Py_buffer *x, Py_ssize_t stride, Py_ssize_t estride,
                         const int64_t *local, const int64_t *rows, Py_ssize_t n, Py_ssize_t width) {
    for (Py_ssize_t j = 0; j < n; j++)  /* checked first: nothing is written unless all fit */
        if (local[j] < 0 || local[j] >= nt || rows[j] < 0 || rows[j] >= targets[local[j]].shape[0])
            return 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_buffer *t = &targets[local[j]];
        dg_add_rows((char *)t->buf + rows[j] * width * t->itemsize, (const char *)x->buf + j * stride,
                    (int)x->itemsize, 0, estride, 1, width);
    }
    return 1;
}

/* The targets of every block of the index, made writable and checked (views in t[0..nt-1]);
   1 ok, 0 not ours (t released), -1 error (t released). */
static int targets_of(PyObject *ctx, PyObject *ids, PyObject *shapes, const Py_buffer *x, Py_ssize_t xspan,
                      Py_buffer *t) {
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    Py_ssize_t nt = PyTuple_GET_SIZE(ids), k = 0;
    int rc = fmt ? 1 : -1;
    for (; rc == 1 && k < nt; k++) {
        PyObject *bo = PyTuple_GET_ITEM(ids, k);
        Py_ssize_t b = PyLong_Check(bo) ? PyLong_AsSsize_t(bo) : -1;
        if (b < 0) {
            PyErr_Clear();
            rc = 0;
            break;
        }
        PyObject *g = dg_writable_grad(ctx, b);
        if (!g) {
            rc = -1;
            break;
        }
        int ok = target_view(ctx, g, PyTuple_GET_ITEM(shapes, k), fmt, &t[k]);
        Py_DECREF(g);  /* gb holds it; the view holds its buffer */
        if (ok && overlaps(&t[k], x, xspan)) {  /* the values must not change while added (Python copies) */
            PyBuffer_Release(&t[k]);
            ok = 0;
        }
        if (!ok)
            rc = 0;
        if (!ok)
            break;
    }
    if (rc != 1)
        while (k-- > 0)  /* t[k] of the failing k was never held */
            PyBuffer_Release(&t[k]);
    return rc;
}

enum { MAX_TARGETS = 64 };  /* more blocks than this in one gather: the Python scatter */

/* MANY: gx (B rows, each contiguous, of the graph's dtype) added into the rows of the row index `ix`.
   1 done, 0 not a case of ours (nothing written; the caller asks scatter_fn), -1 error. */
int dg_scatter_many(PyObject *ctx, PyObject *ix, Py_ssize_t B, const Py_buffer *x) {
    PyObject *ix_type = PyTuple_GET_ITEM(ctx, B_ROWINDEX);
    Py_ssize_t stride, xwidth, estride;
    if (ix_type == Py_None || Py_TYPE(ix) != (PyTypeObject *)ix_type || x->shape[0] != B
        || !dg_row_layout(x, &stride, &xwidth, &estride))
        return 0;
    PyObject *ids = dg_attr(ix, &NAME_IDS, "ids"), *shapes = dg_attr(ix, &NAME_SHAPES, "shapes");
    Py_buffer local, rows, t[MAX_TARGETS];
    int rc = 0, have_local = 0, have_rows = 0;
    if (!ids || !shapes || !PyTuple_CheckExact(ids) || !PyTuple_CheckExact(shapes)
        || PyTuple_GET_SIZE(ids) != PyTuple_GET_SIZE(shapes) || PyTuple_GET_SIZE(ids) == 0
        || PyTuple_GET_SIZE(ids) > MAX_TARGETS)
        goto out;
    have_local = int64_vector(ix, &NAME_LOCAL, "local", &local);
    have_rows = have_local && int64_vector(ix, &NAME_ROWS, "rows", &rows);
    if (!have_rows)
        goto out;
    Py_ssize_t n = rows.shape[0], width = 1;
    PyObject *s0 = PyTuple_GET_ITEM(shapes, 0);
    if (local.shape[0] != n || !PyTuple_CheckExact(s0) || PyTuple_GET_SIZE(s0) < 1)
        goto out;
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(s0); i++)
        width *= PyLong_AsSsize_t(PyTuple_GET_ITEM(s0, i));
    if (PyErr_Occurred() || width < 0 || n != B || xwidth != width)
        goto out;
    Py_ssize_t nt = PyTuple_GET_SIZE(ids);
    rc = targets_of(ctx, ids, shapes, x, dg_row_extent(x, stride, xwidth, estride), t);
    if (rc != 1)
        goto out;
    rc = add_rows_into(t, nt, x, stride, estride, (const int64_t *)local.buf, (const int64_t *)rows.buf, n, width);
    for (Py_ssize_t k = 0; k < nt; k++)
        PyBuffer_Release(&t[k]);
    if (rc == 1) {
        double *acc = (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, B_ACC));
        acc[ACC_SCATTERS] += 1;
        acc[ACC_SCATTER_BYTES] += (double)x->len;
    }
out:
    if (rc == 0)
        PyErr_Clear();  /* attribute lookups that failed: not ours */
    if (have_rows)
        PyBuffer_Release(&rows);
    if (have_local)
        PyBuffer_Release(&local);
    Py_XDECREF(ids);
    Py_XDECREF(shapes);
    return rc;
}

/* Whether the k plans are slices of consecutive rows r0.. of one block b, each needing the same
   gradient g0 (gxs[0]): 1 (b, r0 set) or 0. Never an error: a failed lookup is "not this case". */
static int consecutive_rows(PyObject *ctx, PyObject *plans, PyObject *gxs, PyObject *need, Py_ssize_t k,
                            Py_ssize_t *b_out, Py_ssize_t *r0_out) {
    PyObject *g0 = PyTuple_GET_ITEM(gxs, 0), *p0 = PyList_GET_ITEM(plans, 0);
    if (!PyTuple_CheckExact(p0) || PyTuple_GET_SIZE(p0) != 3)
        return 0;
    PyObject *bo = PyTuple_GET_ITEM(p0, 1);
    long kind = PyLong_Check(PyTuple_GET_ITEM(p0, 0)) ? PyLong_AsLong(PyTuple_GET_ITEM(p0, 0)) : -1;
    Py_ssize_t r0 = PyLong_Check(PyTuple_GET_ITEM(p0, 2)) ? PyLong_AsSsize_t(PyTuple_GET_ITEM(p0, 2)) : -1;
    Py_ssize_t b = PyLong_Check(bo) ? PyLong_AsSsize_t(bo) : -1;
    PyErr_Clear();
    if (kind != SLICE || r0 < 0 || b < 0 || b >= PyList_GET_SIZE(PyTuple_GET_ITEM(ctx, B_BLOCKS)))
        return 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *p = PyList_GET_ITEM(plans, j);
        if (PyTuple_GET_ITEM(gxs, j) != g0 || PyTuple_GET_ITEM(need, j) != Py_True || !PyTuple_CheckExact(p)
            || PyTuple_GET_SIZE(p) != 3 || PyTuple_GET_ITEM(p, 0) != PyTuple_GET_ITEM(p0, 0)
            || PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 1)) != b || PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 2)) != r0 + j) {
            PyErr_Clear();
            return 0;
        }
    }
    *b_out = b;
    *r0_out = r0;
    return 1;
}

/* dy.esum(losses) (autodiff._one_row_run and _one_row_add): one node whose k arguments are
   consecutive rows r0.. of one block, each needing the same (1, ...) gradient g0: g0 added into
   each of those rows. 1 done, 0 not this case (the caller asks one_row_fn), -1 error. */
int dg_one_row_here(PyObject *ctx, PyObject *plans, PyObject *gxs, PyObject *need, Py_ssize_t B) {
    Py_ssize_t k = PyList_GET_SIZE(plans), b, r0;
    if (B != 1 || !PyTuple_CheckExact(gxs) || PyTuple_GET_SIZE(gxs) < k || PyTuple_GET_SIZE(need) < k || k < 1)
        return 0;
    if (!consecutive_rows(ctx, plans, gxs, need, k, &b, &r0))
        return 0;
    PyObject *g0 = PyTuple_GET_ITEM(gxs, 0);
    Py_buffer x;
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    if (!fmt || Py_TYPE(g0) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY)) {
        PyErr_Clear();
        return 0;
    }
    if (dg_get_buffer(g0, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *shape = dg_attr(PyList_GET_ITEM(PyTuple_GET_ITEM(ctx, B_BLOCKS), b), &NAME_SHAPE, "shape");
    int rc = 0;
    Py_buffer t;
    /* g0 is one row shaped like the block's rows: x.shape == (1,) + block.shape[1:] */
    int fits = shape && PyTuple_CheckExact(shape) && x.format && !strcmp(x.format, fmt) && x.ndim >= 1
               && x.shape[0] == 1 && x.ndim == PyTuple_GET_SIZE(shape);
    for (int i = 1; fits && i < x.ndim; i++)
        fits = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i)) == x.shape[i];
    PyErr_Clear();
    if (fits) {
        PyObject *g = dg_writable_grad(ctx, b);
        if (!g) {
            rc = -1;
        } else {
            if (target_view(ctx, g, shape, fmt, &t)) {
                if (r0 + k <= t.shape[0] && !overlaps(&t, &x, x.len)) {
                    Py_ssize_t width = x.len / x.itemsize;  /* x: one contiguous row, added into each of k */
                    dg_add_rows((char *)t.buf + r0 * width * t.itemsize, x.buf, (int)x.itemsize, 0, x.itemsize, k,
                                width);
                    double *acc = (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, B_ACC));
                    acc[ACC_SCATTERS] += 1;
                    acc[ACC_SCATTER_BYTES] += (double)x.len * (double)k;
                    rc = 1;
                }
                PyBuffer_Release(&t);
            }
            Py_DECREF(g);
        }
    }
    Py_XDECREF(shape);
    PyBuffer_Release(&x);
    return rc;
}
