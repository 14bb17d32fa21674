/* The commonest ops' backward run by the backward step itself, with no Python frame (part of
dynagraph._bookkeeping; backward_batch.c documents the context).

Per sentence most batches hold one node, and an op's backward was a Python call of several
microseconds around a kernel of one (checks, pointers, the output arrays). The op's own
code stays the reference and the fallback: each case here is the exact path that code takes
for these operands, so the gradients are bit-identical; any operand it does not expect
(another type, dtype, layout or shape) returns "not ours" and the op's backward runs.

    NB_MATMUL  backends/cpu/direct.py PRODUCT_BACKWARD["matmul"] (MatMul.backward, a small product's
               input gradient by dg_rows_matvec_tgrad): W x with W a parameter's one row whose
               gradient was deferred (autodiff._defer_weight_grads): dx = g @ W[0] (the kernel within
               NB_PRODUCT_ROWS_MAX and NB_PRODUCT_MACS_MAX, numpy's @ beyond)
    NB_AFFINE  the same for Affine.backward, per product; db = reduce_to(g, b.shape)
    NB_LSTM_C  backends/cpu/overrides.py _lstm_c_backward: the C kernel through its address
    NB_LSTM_H  backends/cpu/overrides.py _lstm_h_backward: likewise
    NB_ESUM    ops/elementwise.py ESum.backward: reduce_to(g, x.shape) per argument (g itself mostly)
    NB_ADD     ops/elementwise.py add's backward: the same
    NB_LOOKUP  ops/inputs.py Lookup.backward and its scatter (autodiff.scatter's SparseRows case,
               backends/cpu embedding_backward): the C kernel adds the rows into the table's
               gradient and marks them touched; nothing is left to scatter
    NB_PNLS    backends/cpu/overrides.py _pnls_backward: the C kernel through its address
    NB_TANH, NB_LOGISTIC  backends/cpu/overrides.py _unary_backward below its threshold, i.e.
               ops/elementwise.py _tanh_grad / _logistic_grad: the same float operations in the same
               order, one loop instead of three numpy calls and the adapter's Python frames
    NB_LSTM_STEP  backends/cpu/lstm_step.py lstm_step_backward (backward_step.c)
    NB_CONCAT, NB_RESHAPE, NB_TRANSPOSE, NB_SOFTMAX, NB_COLWISE  backward_shaped.c

The codes and kernel addresses come from the backend's native_backward capability
(backends/cpu/backward.py), which offers a case only where the backend runs that reference. */
#include "backward_batch.h"

#include <stdint.h>

typedef void (*lstmc_f32)(const float *, const float *, const float *, float *, float *, int64_t, int64_t, double);
typedef void (*lstmc_f64)(const double *, const double *, const double *, double *, double *, int64_t, int64_t,
                          double);
typedef void (*lstmh_f32)(const float *, const float *, const float *, float *, float *, int64_t, int64_t);
typedef void (*lstmh_f64)(const double *, const double *, const double *, double *, double *, int64_t, int64_t);




/* (H, forget_bias) of an lstm_c node, H of an lstm_h node; 0 when the attributes are not those. */
static int lstm_attrs(PyObject *attrs, Py_ssize_t *H, double *fb) {
    if (!PyTuple_CheckExact(attrs) || PyTuple_GET_SIZE(attrs) < (fb ? 2 : 1)
        || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0)))
        return 0;
    *H = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0));
    if (fb)
        *fb = PyFloat_AsDouble(PyTuple_GET_ITEM(attrs, 1));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return *H > 0;
}

/* Whether an f64 batch of pre (rows x cols) takes the C kernel (the override's LSTM_F64_MAX). */
static int lstm_size_fits(PyObject *ctx, Py_ssize_t rows, Py_ssize_t cols) {
    const char *f = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    Py_ssize_t cap = PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, B_LSTM_F64_MAX));
    PyErr_Clear();
    return f && (f[0] == 'f' || rows * cols <= cap);
}

/* NB_LSTM_C: pre (B, 4H)[, c_prev (B, H)], g (B, H) -> (dpre[, dc_prev]). */
static PyObject *lstm_c(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t k = PyList_GET_SIZE(xs), H, ps[2], cs[2], gs[2];
    double fb;
    void *pre, *cp = NULL, *gp, *dpre, *dcp = NULL;
    if ((k != 1 && k != 2) || PyTuple_GET_SIZE(need) != k || !lstm_attrs(attrs, &H, &fb)
        || !dg_nb_operand(ctx, PyList_GET_ITEM(xs, 0), 2, ps, 1, &pre) || !dg_nb_operand(ctx, g, 2, gs, 1, &gp)
        || ps[1] != 4 * H || gs[0] != ps[0] || gs[1] != H || !lstm_size_fits(ctx, ps[0], ps[1]))
        return NULL;
    if (k == 2 && (!dg_nb_operand(ctx, PyList_GET_ITEM(xs, 1), 2, cs, 1, &cp) || cs[0] != ps[0] || cs[1] != H))
        return NULL;
    uintptr_t fn = dg_nb_kernel_address(ctx, *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f' ? 0 : 1);
    if (!fn)
        return NULL;
    PyObject *dp = dg_nb_new_block(ctx, ps[0], 4 * H, &dpre), *dc = NULL;
    if (!dp || (k == 2 && !(dc = dg_nb_new_block(ctx, ps[0], H, &dcp)))) {
        Py_XDECREF(dp);
        return NULL;
    }
    if (*PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f')
        ((lstmc_f32)fn)(pre, cp, gp, dpre, dcp, ps[0], H, fb);
    else
        ((lstmc_f64)fn)(pre, cp, gp, dpre, dcp, ps[0], H, fb);
    if (PyTuple_GET_ITEM(need, 0) != Py_True)
        Py_SETREF(dp, Py_NewRef(Py_None));
    if (dc && PyTuple_GET_ITEM(need, 1) != Py_True)
        Py_SETREF(dc, Py_NewRef(Py_None));
    PyObject *out = k == 1 ? PyTuple_Pack(1, dp) : PyTuple_Pack(2, dp, dc);
    Py_DECREF(dp);
    Py_XDECREF(dc);
    return out;
}

/* NB_LSTM_H: pre (B, 4H), c (B, H), g (B, H) -> (dpre or None, dc or None). */
static PyObject *lstm_h(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t H, ps[2], cs[2], gs[2];
    void *pre, *c, *gp, *dpre = NULL, *dcp = NULL;
    if (PyList_GET_SIZE(xs) != 2 || PyTuple_GET_SIZE(need) != 2 || !lstm_attrs(attrs, &H, NULL)
        || !dg_nb_operand(ctx, PyList_GET_ITEM(xs, 0), 2, ps, 1, &pre) || !dg_nb_operand(ctx, PyList_GET_ITEM(xs, 1), 2, cs, 1, &c)
        || !dg_nb_operand(ctx, g, 2, gs, 1, &gp) || ps[1] != 4 * H || cs[0] != ps[0] || cs[1] != H || gs[0] != ps[0]
        || gs[1] != H || !lstm_size_fits(ctx, ps[0], ps[1]))
        return NULL;
    int f32 = *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f';
    uintptr_t fn = dg_nb_kernel_address(ctx, f32 ? 2 : 3);
    if (!fn)
        return NULL;
    PyObject *dp = PyTuple_GET_ITEM(need, 0) == Py_True ? dg_nb_new_block(ctx, ps[0], 4 * H, &dpre) : Py_NewRef(Py_None);
    PyObject *dc = PyTuple_GET_ITEM(need, 1) == Py_True ? dg_nb_new_block(ctx, ps[0], H, &dcp) : Py_NewRef(Py_None);
    if (!dp || !dc) {
        Py_XDECREF(dp);
        Py_XDECREF(dc);
        return NULL;
    }
    if (f32)
        ((lstmh_f32)fn)(pre, c, gp, dpre, dcp, ps[0], H);
    else
        ((lstmh_f64)fn)(pre, c, gp, dpre, dcp, ps[0], H);
    PyObject *out = PyTuple_Pack(2, dp, dc);
    Py_DECREF(dp);
    Py_DECREF(dc);
    return out;
}


/* NB_ESUM, NB_ADD: ops/elementwise.py ESum.backward and add's backward: reduce_to(g, x.shape) for
   each needed argument (g itself where x has g's shape, the common case, decided here). */
static PyObject *pass_through(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t k = PyList_GET_SIZE(xs), gs[8], s[8];
    int gnd, nd;
    if (PyTuple_GET_SIZE(need) != k || (gnd = dg_array_shape(ctx, g, 8, gs)) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++)
        if (dg_array_shape(ctx, PyList_GET_ITEM(xs, i), 8, s) < 0)
            return NULL;
    PyObject *out = PyTuple_New(k);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyList_GET_ITEM(xs, i), *gi;
        if (PyTuple_GET_ITEM(need, i) != Py_True) {
            gi = Py_NewRef(Py_None);
        } else {
            nd = dg_array_shape(ctx, x, 8, s);
            int same = nd == gnd;
            for (int d = 0; same && d < nd; d++)
                same = s[d] == gs[d];
            gi = same ? Py_NewRef(g) : dg_nb_reduced(ctx, g, x);
            if (!gi) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(out, i, gi);
    }
    return out;
}

/* Node data as int64 row ids, each a Python int in [0, bound) (malloc'd; the caller frees), or NULL. */
static int64_t *row_ids(PyObject *data, Py_ssize_t bound) {
    if (!data || !PyList_CheckExact(data) || PyList_GET_SIZE(data) == 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(data);
    int64_t *ids = PyMem_Malloc(n * sizeof(int64_t));
    for (Py_ssize_t j = 0; ids && j < n; j++) {
        PyObject *d = PyList_GET_ITEM(data, j);
        long long v = PyLong_CheckExact(d) ? PyLong_AsLongLong(d) : -1;
        if (v < 0 || v >= bound) {
            PyErr_Clear();
            PyMem_Free(ids);
            return NULL;
        }
        ids[j] = v;
    }
    if (!ids)
        PyErr_Clear();
    return ids;
}

typedef void (*embed_f32)(float *, unsigned char *, const int64_t *, const float *, int64_t, int64_t, int64_t);
typedef void (*embed_f64)(double *, unsigned char *, const int64_t *, const double *, int64_t, int64_t, int64_t);
typedef void (*pnls_f32)(float *, const float *, int64_t, const int64_t *, const float *, int64_t, int64_t);
typedef void (*pnls_f64)(double *, const double *, int64_t, const int64_t *, const double *, int64_t, int64_t);

/* The lookup table's (grad, touched) as writable views, checked: grad C-contiguous of the graph's
   dtype with rows of `width` elements, touched a bool vector of its rows. 1, or 0 (not ours). */
static int table_views(PyObject *ctx, PyObject *arrays, Py_ssize_t width, Py_buffer *gv, Py_buffer *tv) {
    if (!PyTuple_CheckExact(arrays) || PyTuple_GET_SIZE(arrays) != 2)
        return 0;
    PyObject *grad = PyTuple_GET_ITEM(arrays, 0), *touched = PyTuple_GET_ITEM(arrays, 1);
    PyTypeObject *nd = (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY);
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    if (!fmt || Py_TYPE(grad) != nd || Py_TYPE(touched) != nd) {
        PyErr_Clear();
        return 0;
    }
    if (dg_get_buffer(grad, gv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (dg_get_buffer(touched, tv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(gv);
        return 0;
    }
    int ok = gv->format && !strcmp(gv->format, fmt) && gv->ndim >= 1 && tv->format && !strcmp(tv->format, "?")
             && tv->ndim == 1 && tv->shape[0] == gv->shape[0] && gv->shape[0] > 0
             && gv->len == gv->shape[0] * width * gv->itemsize;
    if (!ok) {
        PyBuffer_Release(gv);
        PyBuffer_Release(tv);
    }
    return ok;
}

/* NB_LOOKUP: the rows g (B, ...) added into the table's gradient at the nodes' ids (data), and
   marked touched, by the backend's embedding kernel. (None,): nothing left to scatter. */
static PyObject *lookup(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *plans, PyObject *data) {
    if (PyList_GET_SIZE(xs) != 1 || PyList_GET_SIZE(plans) != 1 || !data || !PyList_CheckExact(data))
        return NULL;
    PyObject *plan = PyList_GET_ITEM(plans, 0);
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(plan, 0))
        || PyLong_AsLong(PyTuple_GET_ITEM(plan, 0)) != LEAF)
        return NULL;
    Py_buffer x;
    if (Py_TYPE(g) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY)
        || dg_get_buffer(g, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(data);
    Py_ssize_t width = x.ndim >= 1 && x.shape[0] == n ? x.len / x.itemsize / (n ? n : 1) : -1;
    int f32 = x.itemsize == 4;
    uintptr_t fn = dg_nb_kernel_address(ctx, f32 ? 4 : 5);
    PyObject *arrays = NULL, *out = NULL;
    Py_buffer gv, tv;
    int64_t *ids = NULL;
    if (width < 0 || !fn
        || !(arrays = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, B_TABLE_ARRAYS), PyTuple_GET_ITEM(plan, 1))))
        goto out;
    if (arrays == Py_None || !table_views(ctx, arrays, width, &gv, &tv))
        goto out;
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    const char *a = x.buf, *b = gv.buf;
    if (fmt && x.format && !strcmp(x.format, fmt) && !(a < b + gv.len && b < a + x.len)
        && (ids = row_ids(data, gv.shape[0]))) {
        if (f32)
            ((embed_f32)fn)(gv.buf, tv.buf, ids, x.buf, width, n, width);
        else
            ((embed_f64)fn)(gv.buf, tv.buf, ids, x.buf, width, n, width);
        double *acc = (double *)PyByteArray_AS_STRING(PyTuple_GET_ITEM(ctx, B_ACC));
        acc[ACC_SCATTERS] += 1;
        acc[ACC_SCATTER_BYTES] += (double)x.len;
        out = PyTuple_Pack(1, Py_None);
    }
    PyBuffer_Release(&gv);
    PyBuffer_Release(&tv);
out:
    if (!out && PyErr_Occurred() && !arrays)
        PyErr_Clear();  /* table_arrays raising: the reference reports it */
    PyMem_Free(ids);
    Py_XDECREF(arrays);
    PyBuffer_Release(&x);
    return out;
}

/* NB_PNLS: x (1 or B, n) and g (B values), labels the nodes' data: (gx,), gx shaped like x. */
static PyObject *pnls(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *data) {
    Py_ssize_t xsh[2];
    void *xb, *gb, *gxb;
    if (PyList_GET_SIZE(xs) != 1 || !data || !PyList_CheckExact(data)
        || !dg_nb_operand(ctx, PyList_GET_ITEM(xs, 0), 2, xsh, 1, &xb))
        return NULL;
    Py_ssize_t rows = PyList_GET_SIZE(data), n = xsh[1];
    Py_buffer gv;
    if (Py_TYPE(g) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY)
        || dg_get_buffer(g, &gv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return NULL;
    }
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    int f32 = fmt && fmt[0] == 'f';
    gb = gv.buf;
    int fits = fmt && gv.format && !strcmp(gv.format, fmt) && gv.len == rows * gv.itemsize && n > 0
               && (xsh[0] == 1 || xsh[0] == rows) && (f32 ? n < 1000 : xsh[0] * n <= 1024);  /* _exp_worth */
    uintptr_t fn = fits ? dg_nb_kernel_address(ctx, f32 ? 6 : 7) : 0;
    int64_t *labels = fn ? row_ids(data, n) : NULL;
    PyObject *gx = labels ? dg_nb_new_block(ctx, xsh[0], n, &gxb) : NULL;
    if (gx) {
        if (f32)
            ((pnls_f32)fn)(gxb, xb, xsh[0] == rows ? n : 0, labels, gb, rows, n);
        else
            ((pnls_f64)fn)(gxb, xb, xsh[0] == rows ? n : 0, labels, gb, rows, n);
    }
    PyMem_Free(labels);
    PyBuffer_Release(&gv);
    if (!gx)
        return NULL;
    PyObject *out = PyTuple_Pack(1, gx);
    Py_DECREF(gx);
    return out;
}

/* _tanh_grad: t = y * y; t = 1 - t; t *= g (numpy's float32 or float64 operations, in that order). */
#define UNARY_GRAD(name, T, EXPR)                                                                        \
    DG_VECTORIZE static void name(T *restrict out, const T *restrict y, const T *restrict g, Py_ssize_t n) { \
        for (Py_ssize_t i = 0; i < n; i++) {                                                            \
            T t;                                                                                        \
            EXPR;                                                                                       \
            out[i] = t;                                                                                 \
        }                                                                                               \
    }
UNARY_GRAD(tanh_grad_f32, float, t = y[i] * y[i]; t = (float)1 - t; t = t * g[i])
UNARY_GRAD(tanh_grad_f64, double, t = y[i] * y[i]; t = (double)1 - t; t = t * g[i])
/* _logistic_grad: t = 1 - y; t *= y; t *= g. */
UNARY_GRAD(logistic_grad_f32, float, t = (float)1 - y[i]; t = t * y[i]; t = t * g[i])
UNARY_GRAD(logistic_grad_f64, double, t = (double)1 - y[i]; t = t * y[i]; t = t * g[i])

/* NB_TANH, NB_LOGISTIC: y and g of one shape (B, ...) of the graph's dtype, contiguous, fewer than
   NB_UNARY_MAX elements (where the cpu adapter runs the op's numpy code) -> (gx,). */
static PyObject *unary(PyObject *ctx, long code, PyObject *xs, PyObject *y, PyObject *g, PyObject *need) {
    Py_ssize_t ys[DG_NB_MAX_ND], gs[DG_NB_MAX_ND], n = 1;
    void *yp, *gp, *op;
    if (PyList_GET_SIZE(xs) != 1 || PyTuple_GET_SIZE(need) != 1 || PyTuple_GET_ITEM(need, 0) != Py_True)
        return NULL;
    int nd = dg_nb_array(ctx, y, ys, 1, &yp);
    if (nd < 1 || dg_nb_array(ctx, g, gs, 1, &gp) != nd)
        return NULL;
    for (int d = 0; d < nd; d++) {
        if (ys[d] != gs[d])
            return NULL;
        n *= ys[d];
    }
    if (n >= NB_UNARY_MAX)
        return NULL;
    PyObject *out = dg_nb_new_shaped(ctx, ys, nd, &op);
    if (!out)
        return NULL;
    int f32 = *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f';
    if (code == NB_TANH) {
        if (f32)
            tanh_grad_f32(op, yp, gp, n);
        else
            tanh_grad_f64(op, yp, gp, n);
    } else {
        if (f32)
            logistic_grad_f32(op, yp, gp, n);
        else
            logistic_grad_f64(op, yp, gp, n);
    }
    PyObject *res = PyTuple_Pack(1, out);
    Py_DECREF(out);
    return res;
}

/* The gradients of one batch by op code (a new reference), or NULL: with an exception set on
   error, without one when the operands are not a case of ours (the op's backward runs). */
PyObject *dg_native_grads(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g,
                          PyObject *need, PyObject *plans, PyObject *data) {
    switch (code) {
    case NB_MATMUL: {
        PyObject *r = dg_nb_matrix_products(ctx, xs, g, need);
        return r || PyErr_Occurred() ? r : dg_nb_products(ctx, xs, g, need, 0);
    }
    case NB_AFFINE:
        return dg_nb_products(ctx, xs, g, need, 1);
    case NB_LSTM_C:
        return lstm_c(ctx, attrs, xs, g, need);
    case NB_LSTM_H:
        return lstm_h(ctx, attrs, xs, g, need);
    case NB_ESUM:
    case NB_ADD:
        return pass_through(ctx, xs, g, need);
    case NB_LOOKUP:
        return lookup(ctx, xs, g, plans, data);
    case NB_PNLS:
        return pnls(ctx, xs, g, data);
    case NB_TANH:
    case NB_LOGISTIC:
        return unary(ctx, code, xs, y, g, need);
    case NB_LSTM_STEP:
        return dg_nb_lstm_step(ctx, attrs, xs, y, g, need, plans);
    case NB_CONCAT:
    case NB_RESHAPE:
    case NB_TRANSPOSE:
    case NB_SOFTMAX:
    case NB_COLWISE:
        return dg_nb_shaped(ctx, code, attrs, xs, y, g, need);
    default:
        return NULL;
    }
}

/* The rows of out = g^T x, each a scaled copy of x, or (add) out += g^T x: each entry one rounded
   multiply, then one rounded add, as numpy's `grad += g.T * x` (this module is built for the
   baseline x86-64, which has no fused multiply-add to contract them into). restrict: checked
   disjoint; vectorised. */
#define DG_OUTER(T, NAME)                                                                                 \
    DG_VECTORIZE static void NAME(T *restrict out, const T *restrict g, const T *restrict x, Py_ssize_t r,   \
                                  Py_ssize_t c, int add) {                                                  \
        for (Py_ssize_t i = 0; i < r; i++) {                                                                \
            const T gi = g[i];                                                                              \
            T *restrict row = out + i * c;                                                                  \
            if (add)                                                                                        \
                for (Py_ssize_t j = 0; j < c; j++)                                                          \
                    row[j] += gi * x[j];                                                                    \
            else                                                                                            \
                for (Py_ssize_t j = 0; j < c; j++)                                                          \
                    row[j] = gi * x[j];                                                                     \
        }                                                                                                   \
    }
DG_OUTER(float, outer_f32)
DG_OUTER(double, outer_f64)
#undef DG_OUTER

/* out = g^T x (add 0) or out += g^T x (add 1) for a (r,) / (1, r) g and a (c,) / (1, c) x and an
   out of r * c elements; all three C-contiguous of one float dtype and out disjoint from both,
   else TypeError with nothing written. */
static PyObject *outer(PyObject *const *argv, Py_ssize_t nargs, int add, const char *name) {
    Py_buffer o, g, x;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(out, g, x)", name);
        return NULL;
    }
    int got = dg_get_buffer(argv[0], &o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) == 0;
    got += got == 1 && dg_get_buffer(argv[1], &g, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0;
    got += got == 2 && dg_get_buffer(argv[2], &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0;
    if (got < 3) {  /* not a writable / contiguous host buffer (a device array, a strided view) */
        if (got > 0)
            PyBuffer_Release(&o);
        if (got > 1)
            PyBuffer_Release(&g);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: out (r*c), g (r) and x (c) must be C-contiguous host arrays", name);
        return NULL;
    }
    Py_ssize_t r = g.itemsize ? g.len / g.itemsize : 0, c = x.itemsize ? x.len / x.itemsize : 0;
    const char *a0 = o.buf, *g0 = g.buf, *x0 = x.buf;
    int ok = o.format && g.format && x.format && !strcmp(o.format, g.format) && !strcmp(o.format, x.format)
             && (!strcmp(o.format, "f") || !strcmp(o.format, "d")) && o.len == r * c * o.itemsize
             && !(a0 < g0 + g.len && g0 < a0 + o.len) && !(a0 < x0 + x.len && x0 < a0 + o.len);
    if (ok) {
        if (o.itemsize == 4)
            outer_f32(o.buf, g.buf, x.buf, r, c, add);
        else
            outer_f64(o.buf, g.buf, x.buf, r, c, add);
    }
    PyBuffer_Release(&o);
    PyBuffer_Release(&g);
    PyBuffer_Release(&x);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: out (r*c), g (r) and x (c) must be distinct C-contiguous arrays of one "
                                      "float dtype", name);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* outer_product(out, g, x): out[i, j] = g[i] * x[j] into a new (1, r, c) or (r, c) array
   (autodiff._weight_grads' one-row dW = g^T x: each entry one rounded multiply, as numpy's). */
PyObject *dg_outer_product(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    return outer(argv, nargs, 0, "outer_product");
}

/* outer_add(grad, g, x): grad[i, j] += g[i] * x[j], a parameter's one-row weight gradient added
   straight into its gradient (autodiff._weight_grads), with no (r, c) temporary to add later. */
PyObject *dg_outer_add(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    return outer(argv, nargs, 1, "outer_add");
}

DG_VECTORIZE static void add_f32(float *restrict d, const float *restrict s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        d[i] = d[i] + s[i];
}

DG_VECTORIZE static void add_f64(double *restrict d, const double *restrict s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        d[i] = d[i] + s[i];
}

/* add_arrays(dsts, srcs): dsts[k] += srcs[k] (flat, elementwise: numpy's in-place add on these
   operands) for two lists of C-contiguous arrays of one float dtype, pairwise of one length and
   disjoint. Every pair is checked before any is written: a TypeError leaves all as they were.
   autodiff._finish adds each parameter's gradient block into its gradient so, in one call. */
PyObject *dg_add_arrays(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1])
        || PyList_GET_SIZE(argv[0]) != PyList_GET_SIZE(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "add_arrays(dsts: list, srcs: list of one length)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(argv[0]), got = 0;
    Py_buffer *v = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    if (!v)
        return PyErr_NoMemory();
    int ok = 1;
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        Py_buffer *d = &v[2 * k], *s = &v[2 * k + 1];
        if (dg_get_buffer(PyList_GET_ITEM(argv[0], k), d, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
            break;
        got++;
        if (dg_get_buffer(PyList_GET_ITEM(argv[1], k), s, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            break;
        got++;
        const char *d0 = d->buf, *s0 = s->buf;
        ok = d->format && s->format && !strcmp(d->format, s->format) && (!strcmp(d->format, "f") || !strcmp(d->format, "d"))
             && d->len == s->len && !(d0 < s0 + s->len && s0 < d0 + d->len);
    }
    ok = ok && got == 2 * n;
    if (ok)
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_buffer *d = &v[2 * k], *s = &v[2 * k + 1];
            if (d->itemsize == 4)
                add_f32(d->buf, s->buf, d->len / 4);
            else
                add_f64(d->buf, s->buf, d->len / 8);
        }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
    if (!ok) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "add_arrays: pairs of disjoint C-contiguous arrays of one float dtype and "
                                         "one length");
        return NULL;
    }
    Py_RETURN_NONE;
}
