/* The backward step's gradient scatters and weight-product deferral in C (part of
dynagraph._bookkeeping; see backward_batch.c, whose context they read, and autodiff.py, whose
scatter() and _defer_weight_grads() are the references: every case not done here goes back to them). */
#include "backward_batch.h"

/* A view of `a` if it is an exact ndarray of the graph's dtype (strides filled in), else 0. */
static int array_view(PyObject *ctx, PyObject *a, Py_buffer *v) {
    if (Py_TYPE(a) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY))
        return 0;
    if (dg_get_buffer(a, v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *want = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    if (!want || !v->format || strcmp(v->format, want) || v->ndim < 1) {
        PyErr_Clear();
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

/* A gradient block g as add_into_rows writes it, into d: its fields as dg_array_read gives them
   (*held 1 when they are a buffer export's, in *v: the caller releases v). 1, or 0 when g is not
   an exact ndarray of the graph's dtype with at least one axis. */
static int grad_target(PyObject *ctx, PyObject *g, Py_buffer *d, Py_buffer *v, int *held) {
    const char *want = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    dg_array_fields f;
    *held = 0;
    if (!want) {
        PyErr_Clear();
        return 0;
    }
    if (Py_TYPE(g) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY) || !dg_array_read(g, &f, v, held))
        return 0;
    if (want[0] != f.format || want[1] || f.nd < 1) {
        if (*held)
            PyBuffer_Release(v);
        *held = 0;
        return 0;
    }
    d->buf = f.data;
    d->ndim = f.nd;
    d->shape = (Py_ssize_t *)f.shape;
    d->strides = (Py_ssize_t *)f.strides;
    d->itemsize = f.itemsize;
    d->readonly = !f.writable;
    return 1;
}

static int c_contiguous(const Py_buffer *v) {
    Py_ssize_t step = v->itemsize;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] > 1 && v->strides[i] != step)
            return 0;
        step *= v->shape[i];
    }
    return 1;
}

/* g + gx as a new C-contiguous array, for g (viewed as d) and gx (x) both C-contiguous of the graph's
   dtype and one shape: numpy's g + gx (one IEEE add per element, and a C-contiguous result for such
   operands) without its ufunc call, ~3.8k instructions a call on the per-sentence path. NULL with
   an exception set on failure. */
static PyObject *contiguous_sum(PyObject *ctx, const Py_buffer *d, const Py_buffer *x) {
    PyObject *shape = dg_shape_of(d);
    if (!shape)
        return NULL;
    PyObject *argv[2] = {shape, PyTuple_GET_ITEM(ctx, B_DTYPE)};
    PyObject *out = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_EMPTY), argv, 2, NULL);
    Py_DECREF(shape);
    Py_buffer w;
    if (!out || dg_get_buffer(out, &w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    if (w.len != d->len || w.itemsize != d->itemsize) {
        PyBuffer_Release(&w);
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "backward_batch_native: empty() made an unexpected array");
        return NULL;
    }
    Py_ssize_t n = d->len / d->itemsize;
    if (d->itemsize == 4)
        for (Py_ssize_t i = 0; i < n; i++)
            ((float *)w.buf)[i] = ((const float *)d->buf)[i] + ((const float *)x->buf)[i];
    else
        for (Py_ssize_t i = 0; i < n; i++)
            ((double *)w.buf)[i] = ((const double *)d->buf)[i] + ((const double *)x->buf)[i];
    PyBuffer_Release(&w);
    return out;
}

/* Block b's borrowed gradient g plus gx, as the block's own new array, where gx covers the whole
   block with g's exact shape; 1: done, 0: not this case, -1: error. */
static int borrowed_add(PyObject *ctx, Py_ssize_t b, PyObject *g, PyObject *gx, const Py_buffer *x, Py_ssize_t r0,
                        Py_ssize_t B, Py_ssize_t vrows) {
    if (r0 != 0 || B != vrows)
        return 0;
    Py_INCREF(g);
    Py_buffer d;
    PyObject *sum = NULL;
    int fits = array_view(ctx, g, &d);
    if (fits) {
        fits = d.ndim == x->ndim && d.itemsize == x->itemsize;
        for (int i = 0; fits && i < d.ndim; i++)
            fits = d.shape[i] == x->shape[i];
        if (fits)
            sum = c_contiguous(&d) && c_contiguous(x) && (d.itemsize == 4 || d.itemsize == 8) && x->format
                          && !strcmp(x->format, d.format)
                      ? contiguous_sum(ctx, &d, x) : PyNumber_Add(g, gx);
        PyBuffer_Release(&d);
    }
    Py_DECREF(g);
    if (!fits)
        return 0;
    if (!sum)
        return -1;
    PyObject *gb = PyTuple_GET_ITEM(ctx, B_GB), *bkey = dg_int(b);
    int bad = !bkey || PySet_Discard(PyTuple_GET_ITEM(ctx, B_BORROWED), bkey) < 0 || b >= PyList_GET_SIZE(gb);
    Py_XDECREF(bkey);
    if (bad) {
        Py_DECREF(sum);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "backward_batch_native: gradient block out of range");
        return -1;
    }
    PyList_SetItem(gb, b, sum);  /* steals; drops the borrowed array (an ndarray: no Python code runs) */
    return 1;
}

/* LEAF: a dense gradient kept in leaf_sums[bo], for one sum at the end. 1, or -1 on error. */
static int keep_leaf_sum(PyObject *ctx, PyObject *bo, PyObject *gx) {
    PyObject *parts = PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, B_LEAF_SUMS), bo);
    if (!parts) {
        if (PyErr_Occurred() || !(parts = PyList_New(0)))
            return -1;
        int bad = PyDict_SetItem(PyTuple_GET_ITEM(ctx, B_LEAF_SUMS), bo, parts);
        Py_DECREF(parts);
        if (bad)
            return -1;
    }
    return PyList_Append(parts, gx) < 0 ? -1 : 1;
}

/* SLICE, block b has no gradient yet: gx, exactly the block's shape from row 0 and
   C-contiguous, is adopted as it, borrowed. 1 adopted, 0 not our case, -1 on error. */
static int adopt_gradient(PyObject *ctx, PyObject *gb, Py_ssize_t b, PyObject *gx, Py_buffer *x, Py_ssize_t r0,
                          Py_ssize_t B, Py_ssize_t vrows) {
    if (r0 != 0 || B != vrows || !c_contiguous(x))
        return 0;
    PyObject *bkey = dg_int(b);
    int bad = !bkey || PySet_Add(PyTuple_GET_ITEM(ctx, B_BORROWED), bkey) < 0;
    Py_XDECREF(bkey);
    if (bad || b >= PyList_GET_SIZE(gb))  /* the set's hash ran no Python code: an int */
        return -1;
    Py_INCREF(gx);
    PyList_SetItem(gb, b, gx);  /* steals; b is in range; the old item is None */
    return 1;
}

/* SLICE into an owned gradient block g: x's rows (each contiguous, any row stride: a
   concatenate's gradient is a view) added into its rows r0 .. r0+B-1 in place. 1 added, 0 not
   our case (g not a writable C-contiguous array of those rows, or an overlap: numpy buffers
   an overlapping add, this loop would not). */
static int add_into_rows(PyObject *ctx, PyObject *g, Py_buffer *x, Py_ssize_t r0, Py_ssize_t B, Py_ssize_t vrows) {
    Py_ssize_t stride, xwidth, estride;
    if (!dg_row_layout(x, &stride, &xwidth, &estride))
        return 0;
    Py_INCREF(g);
    Py_buffer d, v;
    int held;
    if (!grad_target(ctx, g, &d, &v, &held)) {
        Py_DECREF(g);
        return 0;
    }
    int rc = 0, fits = !d.readonly && c_contiguous(&d) && d.ndim == x->ndim && d.shape[0] == vrows;
    for (int i = 1; fits && i < d.ndim; i++)
        fits = d.shape[i] == x->shape[i];
    if (fits) {
        Py_ssize_t width = 1;
        for (int i = 1; i < d.ndim; i++)
            width *= d.shape[i];
        char *dst = (char *)d.buf + r0 * width * d.itemsize;
        const char *src = x->buf;
        Py_ssize_t n = B * width * d.itemsize, xn = dg_row_extent(x, stride, xwidth, estride);
        if (xwidth == width && (src + xn <= dst || dst + n <= src)) {
            dg_add_rows(dst, src, (int)d.itemsize, stride, estride, B, width);
            rc = 1;
        }
    }
    if (held)
        PyBuffer_Release(&v);
    Py_DECREF(g);
    return rc;
}

/* SLICE (plan (1, b, r0)): gx's B rows into rows r0.. of block b's gradient: adopted when
   there is none yet, added copy-on-write when it is borrowed, else added in place.
   1 done, 0 not our case, -1 on error. */
static int scatter_slice(PyObject *ctx, PyObject *plan, Py_ssize_t b, PyObject *gx, Py_buffer *x, Py_ssize_t B,
                         Py_ssize_t vrows) {
    PyObject *gb = PyTuple_GET_ITEM(ctx, B_GB);
    Py_ssize_t r0 = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 2));
    if (r0 == -1 && PyErr_Occurred())
        return -1;
    if (x->shape[0] != B || r0 < 0 || r0 + B > vrows)
        return 0;  /* a broadcast row, or rows the reference reports */
    PyObject *g = PyList_GET_ITEM(gb, b);
    int rc;
    if (g == Py_None) {
        rc = adopt_gradient(ctx, gb, b, gx, x, r0, B, vrows);
    } else {
        PyObject *bkey = dg_int(b);
        int borrowed = bkey ? PySet_Contains(PyTuple_GET_ITEM(ctx, B_BORROWED), bkey) : -1;
        Py_XDECREF(bkey);
        if (borrowed < 0)
            return -1;
        if (!borrowed)
            return add_into_rows(ctx, g, x, r0, B, vrows);
        /* copy-on-write: the block's gradient is another's array; a whole-block add makes the
           block's own array in one pass (g + gx: the values of the reference's copy, then add) */
        rc = borrowed_add(ctx, b, g, gx, x, r0, B, vrows);
    }
    if (rc != 0)
        return rc;
    /* some rows of a block with no gradient yet (or a borrowed one): the reference's zero block
       (or copy) made by grad_block, then the rows added into it */
    if (!(g = dg_writable_grad(ctx, b)))
        return -1;
    rc = add_into_rows(ctx, g, x, r0, B, vrows);
    Py_DECREF(g);
    return rc;
}

/* The scatter cases done here; 1: done, 0: not a case of ours (the caller asks scatter_fn), -1: error.
     LEAF, a dense ndarray shaped like the block's rows: kept in leaf_sums (autodiff.scatter's first case);
     SLICE, no gradient yet, gx exactly the block's shape from row 0: adopted, borrowed (its second);
     SLICE, an owned C-contiguous gradient block: gx added into its rows (its SLICE case), a missing
       or borrowed one made by grad_block first;
     MANY, a gathered argument: gx added into the rows of every block it was gathered from (grad_rows.c). */
int dg_scatter_here(PyObject *ctx, PyObject *plan, PyObject *gx, Py_ssize_t B) {
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 3)
        return 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
    if (kind == -1 && PyErr_Occurred())
        return -1;
    if (kind == MANY) {
        Py_buffer x;
        if (!array_view(ctx, gx, &x))
            return 0;
        int rc = dg_scatter_many(ctx, PyTuple_GET_ITEM(plan, 1), B, &x);
        PyBuffer_Release(&x);
        return rc;
    }
    if (kind != LEAF && kind != SLICE)
        return 0;
    PyObject *bo = PyTuple_GET_ITEM(plan, 1), *blocks = PyTuple_GET_ITEM(ctx, B_BLOCKS);
    Py_ssize_t b = dg_index_in(bo, PyList_GET_SIZE(blocks));
    if (b < 0 || b >= PyList_GET_SIZE(PyTuple_GET_ITEM(ctx, B_GB))) {
        PyErr_Clear();
        return 0;  /* the reference raises its own error */
    }
    Py_buffer x;
    if (!array_view(ctx, gx, &x))
        return 0;
    PyObject *block = PyList_GET_ITEM(blocks, b);
    Py_INCREF(block);
    int rc = 0;
    Py_ssize_t vshape[32];
    int vnd = dg_array_dims(block, 32, vshape);  /* numpy's fields: no buffer export for a shape */
    int same_rows = vnd >= 1 && x.ndim == vnd;  /* gx.shape[1:] == block.shape[1:] */
    for (int i = 1; same_rows && i < x.ndim; i++)
        same_rows = x.shape[i] == vshape[i];
    if (same_rows)
        rc = kind == LEAF ? keep_leaf_sum(ctx, bo, gx) : scatter_slice(ctx, plan, b, gx, &x, B, vshape[0]);
    Py_DECREF(block);
    PyBuffer_Release(&x);
    return rc;
}

/* The ndim of an exact ndarray with at most max_nd dims (its dims into shape), else -1. */
int dg_array_shape(PyObject *ctx, PyObject *a, int max_nd, Py_ssize_t *shape) {
    if (Py_TYPE(a) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY))
        return -1;
    return dg_array_dims(a, max_nd, shape);
}

enum { MAXP = 8 };  /* the most weight products of one op that are deferred here */

/* products_fn(k) as a tuple of (w, x) argument pairs, cached per (products_fn, k). A new
   reference, or NULL with an exception set. */
static PyObject *product_pairs(PyObject *ctx, PyObject *products_fn, Py_ssize_t k) {
    PyObject *cache = PyTuple_GET_ITEM(ctx, B_PRODUCTS), *key = dg_tuple_on(products_fn, k);
    if (!key)
        return NULL;
    PyObject *pairs = PyDict_GetItemWithError(cache, key);
    if (pairs)
        Py_INCREF(pairs);
    else if (!PyErr_Occurred() && (pairs = PyObject_CallFunction(products_fn, "n", k))) {
        PyObject *t = PySequence_Tuple(pairs);
        Py_SETREF(pairs, t);
        if (pairs && PyDict_SetItem(cache, key, pairs) < 0)
            Py_CLEAR(pairs);
    }
    Py_DECREF(key);
    return pairs;
}

/* Every pair checked first, nothing changed: anything unusual is the reference's. take[p]:
   whether pair p is a parameter's one row W (LEAF, shape (1, rows, cols)) times a batch of
   vectors x (B, cols) with g (B, rows). 1 when every pair is ours to judge, else 0. */
static int check_pairs(PyObject *ctx, PyObject *pairs, PyObject *xs, PyObject *plans, PyObject *need,
                       const Py_ssize_t *gs, int *take, Py_ssize_t *w_of, Py_ssize_t *x_of) {
    Py_ssize_t ws[4], xsh[4], k = PyList_GET_SIZE(xs);
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(pairs); p++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, p);
        Py_ssize_t w = -1, x = -1;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
            w = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
            x = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
            PyErr_Clear();
        }
        if (w < 0 || w >= k || x < 0 || x >= k || PyTuple_GET_SIZE(need) != k)
            return 0;
        int wnd = dg_array_shape(ctx, PyList_GET_ITEM(xs, w), 4, ws), xnd = dg_array_shape(ctx, PyList_GET_ITEM(xs, x), 4, xsh);
        if (wnd < 1 || xnd < 1)
            return 0;
        PyObject *plan = PyList_GET_ITEM(plans, w), *kind = PyTuple_CheckExact(plan) && PyTuple_GET_SIZE(plan) == 3
                                                             ? PyTuple_GET_ITEM(plan, 0) : NULL;
        take[p] = PyTuple_GET_ITEM(need, w) == Py_True && kind && PyLong_CheckExact(kind)
                  && PyLong_AsLong(kind) == LEAF && wnd == 3 && ws[0] == 1 && xnd == 2 && xsh[0] == gs[0]
                  && gs[1] == ws[1] && xsh[1] == ws[2];
        w_of[p] = w;
        x_of[p] = x;
    }
    return 1;
}

/* (g, x) appended to deferred[b], b the weight's block. 0, or -1 with an exception set. */
int dg_defer_pair(PyObject *ctx, PyObject *b, PyObject *g, PyObject *x) {
    PyObject *deferred = PyTuple_GET_ITEM(ctx, B_DEFERRED);
    PyObject *lst = PyDict_GetItemWithError(deferred, b);
    if (!lst) {
        if (PyErr_Occurred() || !(lst = PyList_New(0)) || PyDict_SetItem(deferred, b, lst) < 0) {
            Py_XDECREF(lst);
            return -1;
        }
        Py_DECREF(lst);  /* the dict holds it */
    }
    PyObject *entry = PyTuple_Pack(2, g, x);
    if (!entry || PyList_Append(lst, entry) < 0) {
        Py_XDECREF(entry);
        return -1;
    }
    Py_DECREF(entry);
    return 0;
}

/* need[w] set to False in *out, made on first use as a new copy of need (the caller's need
   may be shared). 0, or -1 with an exception set. */
static int drop_need(PyObject *need, PyObject **out, Py_ssize_t w) {
    if (!*out) {
        Py_ssize_t k = PyTuple_GET_SIZE(need);
        if (!(*out = PyTuple_New(k)))
            return -1;
        for (Py_ssize_t c = 0; c < k; c++) {
            PyObject *v = PyTuple_GET_ITEM(need, c);
            Py_INCREF(v);
            PyTuple_SET_ITEM(*out, c, v);
        }
    }
    PyObject *old = PyTuple_GET_ITEM(*out, w);
    Py_INCREF(Py_False);
    PyTuple_SET_ITEM(*out, w, Py_False);
    Py_DECREF(old);
    return 0;
}

/* autodiff._defer_weight_grads for a batch whose operands are exact ndarrays: each product W x
   with W a parameter's one row and x a batch of vectors keeps (g, x) in deferred and drops W from
   *need (a new tuple). 1: done, 0: not ndarrays (the caller asks defer_fn; nothing was changed),
   -1: error. */
int dg_defer_here(PyObject *ctx, PyObject *products_fn, PyObject *xs, PyObject *plans, PyObject *g,
                      PyObject **need) {
    Py_ssize_t gs[4], w_of[MAXP], x_of[MAXP];
    int gnd = dg_array_shape(ctx, g, 4, gs), take[MAXP];
    if (gnd < 1)
        return 0;
    if (gnd != 2)
        return 1;  /* as the reference: only (B, rows) gradients */
    PyObject *pairs = product_pairs(ctx, products_fn, PyList_GET_SIZE(xs));
    if (!pairs)
        return -1;
    Py_ssize_t np_ = PyTuple_GET_SIZE(pairs);
    int rc = np_ <= MAXP && check_pairs(ctx, pairs, xs, plans, *need, gs, take, w_of, x_of);
    PyObject *out = NULL;
    for (Py_ssize_t p = 0; rc == 1 && p < np_; p++) {
        if (!take[p])
            continue;
        PyObject *b = PyTuple_GET_ITEM(PyList_GET_ITEM(plans, w_of[p]), 1);
        if (dg_defer_pair(ctx, b, g, PyList_GET_ITEM(xs, x_of[p])) < 0 || drop_need(*need, &out, w_of[p]) < 0)
            rc = -1;
    }
    Py_DECREF(pairs);
    if (rc == 1 && out)
        Py_SETREF(*need, out);
    else
        Py_XDECREF(out);
    return rc;
}
