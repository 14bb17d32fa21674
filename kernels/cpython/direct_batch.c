/* Direct kernels (part of dynagraph._bookkeeping; see bookkeeping.h): small batches of the
commonest ops run by run_batch_native (batch_run.c) without the op's Python kernel.

backends/cpu/direct.py describes the design and holds each op's descriptor and Python twin.
Each kind checks every argument (type, dtype, layout, shape, indices) and returns 0, having
done nothing, for anything it does not take: the batch then runs the twin, which makes the
same decision and calls the same kernel, so both paths leave identical values.
*/
#include <string.h>

#include "bookkeeping.h"

typedef void (*unary_f32)(int, float *, const float *, int64_t);
typedef void (*unary_f64)(int, double *, const double *, int64_t);
typedef void (*binary_f32)(int, float *, const float *, int64_t, const float *, int64_t, int64_t, int64_t);
typedef void (*binary_f64)(int, double *, const double *, int64_t, const double *, int64_t, int64_t, int64_t);
typedef void (*sum_f32)(float *, const float *const *, const int64_t *, int64_t, int64_t, int64_t, double);
typedef void (*sum_f64)(double *, const double *const *, const int64_t *, int64_t, int64_t, int64_t, double);
typedef void (*pnls_f32)(float *, float *, const float *, int64_t, const int64_t *, int64_t, int64_t);
typedef void (*pnls_f64)(double *, double *, const double *, int64_t, const int64_t *, int64_t, int64_t);
typedef void (*take_f32)(float *, const float *, const int64_t *, int64_t, int64_t);
typedef void (*take_f64)(double *, const double *, const int64_t *, int64_t, int64_t);
typedef void (*lstmc_f32)(const float *, const float *, float *, int64_t, int64_t, double);
typedef void (*lstmc_f64)(const double *, const double *, double *, int64_t, int64_t, double);
typedef void (*lstmh_f32)(const float *, const float *, float *, int64_t, int64_t);
typedef void (*lstmh_f64)(const double *, const double *, double *, int64_t, int64_t);

/* [kind - 1][0: float32, 1: float64]; NULL until set_direct_kernels */
static void *direct_fn[DIRECT_KINDS][2];

/* set_direct_kernels(unary_f32, unary_f64, binary_f32, ..., lstmh_f64, matvec_f32, matvec_f64, lstm_f32,
   lstm_f64, softmax_f32, softmax_f64, small_matmul_f32, small_matmul_f64): the kernels' addresses
   (dg_unary_fwd_*, dg_binary_fwd_*, dg_sum_args_*, dg_pnls_fwd_*, dg_take_rows_*, dg_lstmc_fwd_*,
   dg_lstmh_fwd_*, dg_rows_matvec_*, dg_lstm_fwd_*, dg_softmax_fwd_*, dg_small_matmul_* of dynagraph._kernels),
   set once by backends/cpu/direct.py. */
PyObject *dg_set_direct_kernels(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 * DIRECT_KINDS + 8) {
        PyErr_SetString(PyExc_TypeError, "set_direct_kernels takes 22 kernel addresses");
        return NULL;
    }
    void *got[2 * DIRECT_KINDS + 8];
    for (int i = 0; i < 2 * DIRECT_KINDS + 8; i++) {
        got[i] = PyLong_AsVoidPtr(argv[i]);
        if (!got[i]) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "set_direct_kernels: a null kernel address");
            return NULL;
        }
    }
    for (int i = 0; i < 2 * DIRECT_KINDS; i++)
        direct_fn[i / 2][i % 2] = got[i];
    dg_set_matvec_kernels(got[2 * DIRECT_KINDS], got[2 * DIRECT_KINDS + 1]);
    dg_set_step_kernels(got[2 * DIRECT_KINDS + 2], got[2 * DIRECT_KINDS + 3]);
    dg_set_shaped_kernels(got[2 * DIRECT_KINDS + 4], got[2 * DIRECT_KINDS + 5], got[2 * DIRECT_KINDS + 6],
                          got[2 * DIRECT_KINDS + 7]);
    Py_RETURN_NONE;
}

/* The arguments' buffers (C-contiguous, of one real format), or -1 with no error set when some
   argument is not such an array (the batch then takes the op's Python kernel), -1 with an error
   set on failure. *t: 0 float32, 1 float64. Released by release_all. */
static int argument_buffers(const dg_direct_ctx *ctx, PyObject *xs, Py_buffer *v, int *t) {
    PyTypeObject *nd = ctx->ndarray;
    Py_ssize_t k = PyList_GET_SIZE(xs);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyList_GET_ITEM(xs, i);
        if (Py_TYPE(x) != nd || dg_get_buffer(x, &v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            for (Py_ssize_t j = 0; j < i; j++)
                PyBuffer_Release(&v[j]);
            return -1;
        }
        int ti = v[i].format && !strcmp(v[i].format, "f") ? 0 : v[i].format && !strcmp(v[i].format, "d") ? 1 : -1;
        if (ti < 0 || (i && ti != *t) || v[i].ndim < 1 || v[i].len == 0) {
            for (Py_ssize_t j = 0; j <= i; j++)
                PyBuffer_Release(&v[j]);
            return -1;
        }
        *t = ti;
    }
    return 0;
}

static void release_all(Py_buffer *v, Py_ssize_t k) {
    for (Py_ssize_t i = 0; i < k; i++)
        PyBuffer_Release(&v[i]);
}

/* For a binary or n-ary kernel: the batch size B when every argument has at least 2 axes, one
   row shape and a leading axis of 1 or B; *lead: an argument with B rows; *n: elements per row.
   0 when they do not. */
static Py_ssize_t batch_rows(const Py_buffer *v, Py_ssize_t k, Py_ssize_t *lead, Py_ssize_t *n) {
    Py_ssize_t B = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (v[i].ndim < 2 || v[i].ndim != v[0].ndim)
            return 0;
        for (int d = 1; d < v[0].ndim; d++)
            if (v[i].shape[d] != v[0].shape[d])
                return 0;
        if (v[i].shape[0] > B) {
            B = v[i].shape[0];
            *lead = i;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (v[i].shape[0] != 1 && v[i].shape[0] != B)
            return 0;
    *n = (v[0].len / v[0].itemsize) / v[0].shape[0];
    return B;
}


/* The batch's data (a list of exact ints, one per node) as int64 indices each in [0, bound):
   a PyMem array, or NULL with no error set when some item is not such an int (the Python
   kernel then decides, and raises for a bad index), NULL with an error set on failure. */
static int64_t *index_array(PyObject *data, Py_ssize_t bound) {
    Py_ssize_t B = PyList_GET_SIZE(data);
    int64_t *out = PyMem_Malloc((size_t)(B ? B : 1) * sizeof(int64_t));
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < B; i++) {
        PyObject *d = PyList_GET_ITEM(data, i);
        Py_ssize_t v = PyLong_CheckExact(d) ? PyLong_AsSsize_t(d) : -1;
        if (v < 0 || v >= bound) {
            PyErr_Clear();  /* an overflow: not an index the kernel takes */
            PyMem_Free(out);
            return NULL;
        }
        out[i] = v;
    }
    return out;
}

/* numpy.empty(v's shape, dtype t). */
static PyObject *empty_like_buffer(const dg_direct_ctx *ctx, const Py_buffer *v, int t) {
    PyObject *shape = dg_shape_of(v);
    if (!shape)
        return NULL;
    PyObject *out = dg_direct_empty_of(ctx, shape, t);
    Py_DECREF(shape);
    return out;
}

/* pickneglogsoftmax (DIRECT_PNLS) and lookup (DIRECT_TAKE): one argument, whose buffer is v,
   the batch's data list of indices. As direct_batch: 1 with *y, 0 when it does not fit, -1. */
static int direct_indexed(const dg_direct_ctx *ctx, long kind, const Py_ssize_t *bound, int t, Py_buffer *v,
                          PyObject *data, PyObject **y) {
    if (!PyList_CheckExact(data))
        return 0;
    Py_ssize_t B = PyList_GET_SIZE(data), size = v->len / v->itemsize;
    if (B == 0 || size > bound[t])
        return 0;
    Py_ssize_t n, classes;
    if (kind == DIRECT_PNLS) {
        if (v->ndim != 2 || (v->shape[0] != 1 && v->shape[0] != B))
            return 0;
        n = classes = v->shape[1];
    } else {
        if (v->ndim < 2 || v->shape[0] != 1)
            return 0;
        classes = v->shape[1];
        n = size / classes;
    }
    int64_t *idx = index_array(data, classes);
    if (!idx)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *shape = PyTuple_New(kind == DIRECT_PNLS ? 2 : v->ndim - 1);
    int rc = -1;
    if (!shape)
        goto out;
    PyTuple_SET_ITEM(shape, 0, PyLong_FromSsize_t(B));
    if (kind == DIRECT_PNLS)
        PyTuple_SET_ITEM(shape, 1, PyLong_FromLong(1));
    else
        for (int d = 2; d < v->ndim; d++)
            PyTuple_SET_ITEM(shape, d - 1, PyLong_FromSsize_t(v->shape[d]));
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++)
        if (!PyTuple_GET_ITEM(shape, d))
            goto out;
    PyObject *made = dg_direct_empty_of(ctx, shape, t);
    Py_buffer w;
    if (!made || dg_get_buffer(made, &w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(made);
        goto out;
    }
    if (w.len != B * (kind == DIRECT_PNLS ? 1 : n) * v->itemsize) {
        PyErr_SetString(PyExc_RuntimeError, "run_batch_native: empty made an array of another size");
        PyBuffer_Release(&w);
        Py_DECREF(made);
        goto out;
    }
    void *fn = direct_fn[kind - 1][t];
    if (kind == DIRECT_PNLS) {
        void *work = PyMem_Malloc((size_t)n * (size_t)v->itemsize);
        if (!work) {
            PyErr_NoMemory();
            PyBuffer_Release(&w);
            Py_DECREF(made);
            goto out;
        }
        int64_t xstride = v->shape[0] == B ? n : 0;
        if (t == 0)
            ((pnls_f32)fn)(w.buf, work, v->buf, xstride, idx, (int64_t)B, (int64_t)n);
        else
            ((pnls_f64)fn)(w.buf, work, v->buf, xstride, idx, (int64_t)B, (int64_t)n);
        PyMem_Free(work);
    } else if (t == 0) {
        ((take_f32)fn)(w.buf, v->buf, idx, (int64_t)B, (int64_t)n);
    } else {
        ((take_f64)fn)(w.buf, v->buf, idx, (int64_t)B, (int64_t)n);
    }
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    rc = 1;
out:
    Py_XDECREF(shape);
    PyMem_Free(idx);
    return rc;
}


/* lstm_c (DIRECT_LSTMC: pre (B, 4H)[, c_prev (B, H)]; attrs (H, forget_bias)) and lstm_h
   (DIRECT_LSTMH: pre (B, 4H), c (B, H); attrs (H,)): every argument with B rows of exactly
   those widths, pre within the bound. As direct_batch: 1 with *y, 0 when it does not fit, -1. */
static int direct_lstm(const dg_direct_ctx *ctx, long kind, const Py_ssize_t *bound, int t, PyObject *xs, Py_buffer *v,
                       PyObject *attrs, PyObject **y) {
    Py_ssize_t k = PyList_GET_SIZE(xs);
    if (!PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) != (kind == DIRECT_LSTMC ? 2 : 1)
        || (kind == DIRECT_LSTMC ? k > 2 : k != 2))
        return 0;
    Py_ssize_t H = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0));
    double fb = kind == DIRECT_LSTMC ? PyFloat_AsDouble(PyTuple_GET_ITEM(attrs, 1)) : 0.0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t B = v[0].shape[0];
    if (H <= 0 || v[0].ndim != 2 || v[0].shape[1] != 4 * H || v[0].len / v[0].itemsize > bound[t])
        return 0;
    for (Py_ssize_t i = 1; i < k; i++)
        if (v[i].ndim != 2 || v[i].shape[0] != B || v[i].shape[1] != H)
            return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_rows(ctx, B, H, t, &w);
    if (!made)
        return -1;
    void *fn = direct_fn[kind - 1][t];
    const void *c = k == 2 ? v[1].buf : NULL;
    if (kind == DIRECT_LSTMC) {
        if (t == 0)
            ((lstmc_f32)fn)(v[0].buf, c, w.buf, (int64_t)B, (int64_t)H, fb);
        else
            ((lstmc_f64)fn)(v[0].buf, c, w.buf, (int64_t)B, (int64_t)H, fb);
    } else if (t == 0) {
        ((lstmh_f32)fn)(v[0].buf, c, w.buf, (int64_t)B, (int64_t)H);
    } else {
        ((lstmh_f64)fn)(v[0].buf, c, w.buf, (int64_t)B, (int64_t)H);
    }
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}


/* concatenate along the first per-node axis (DIRECT_CONCAT; attrs (0,)): the output
   (B,) + shape (shape: the node's, from the graph), each node's row the arguments' rows one
   after another (a row-major array's first axis). Every argument has the output's trailing
   axes (missing ones counting as 1: attention's (2H, 1) context beside an (H,) vector), and 1 or B rows; their first per-node axes add up to the output's.
   A copy, exact as numpy's. As direct_batch: 1 with *y, 0 when it does not fit, -1. */
static int direct_concat(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, PyObject *xs, Py_buffer *v,
                         PyObject *attrs, PyObject *shape, Py_ssize_t B, PyObject **y) {
    Py_ssize_t k = PyList_GET_SIZE(xs), nd = PyTuple_GET_SIZE(shape);
    if (!PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) < 1 || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0))
        || PyLong_AsLong(PyTuple_GET_ITEM(attrs, 0)) != 0 || nd < 1)
        return 0;
    Py_ssize_t tail = 1, first = 0, total;
    for (Py_ssize_t d = 0; d < nd; d++) {
        Py_ssize_t e = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (e < 0) {
            PyErr_Clear();
            return 0;
        }
        if (d == 0)
            total = e;
        else
            tail *= e;
    }
    for (Py_ssize_t i = 0; i < k; i++) {  /* an argument with fewer axes is padded with axes of 1 */
        if (v[i].ndim < 2 || v[i].ndim > nd + 1 || (v[i].shape[0] != 1 && v[i].shape[0] != B))
            return 0;
        for (Py_ssize_t d = 1; d < nd; d++)
            if ((d + 1 < v[i].ndim ? v[i].shape[d + 1] : 1) != PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d)))
                return 0;
        first += v[i].shape[1];
    }
    if (first != total || B * total * tail > bound[t])
        return 0;
    Py_ssize_t item = v[0].itemsize, row = total * tail * item;
    Py_buffer w;
    PyObject *made = dg_direct_new_batch(ctx, shape, B, t, B * row, &w);
    if (!made)
        return -1;
    for (Py_ssize_t r = 0; r < B; r++) {
        char *dst = (char *)w.buf + r * row;
        for (Py_ssize_t i = 0; i < k; i++) {
            Py_ssize_t part = v[i].shape[1] * tail * item;
            memcpy(dst, (const char *)v[i].buf + (v[i].shape[0] == 1 ? 0 : r * part), (size_t)part);
            dst += part;
        }
    }
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}


/* Calls the kernel of `desc` for the batch's arguments xs: 1 with *y its output (a new array),
   0 when the batch does not fit the kernel (nothing done, no error), -1 on error. */
int dg_direct_batch(const dg_direct_ctx *ctx, PyObject *desc, PyObject *xs, PyObject *data, PyObject *attrs,
                        PyObject *shape, Py_ssize_t nodes, PyObject **y) {
    if (!PyTuple_CheckExact(desc) || PyTuple_GET_SIZE(desc) != 4)
        return 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(desc, 0)), code = PyLong_AsLong(PyTuple_GET_ITEM(desc, 1));
    Py_ssize_t bound[2] = {PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 2)), PyLong_AsSsize_t(PyTuple_GET_ITEM(desc, 3))};
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t k = PyList_GET_SIZE(xs);
    if (kind < DIRECT_UNARY || kind > DIRECT_COLWISE || (kind <= DIRECT_KINDS && !direct_fn[kind - 1][0]) || k < 1
        || ((kind == DIRECT_UNARY || kind == DIRECT_PNLS || kind == DIRECT_TAKE) && k != 1)
        || (kind == DIRECT_BINARY && k != 2)
        || ((kind == DIRECT_PNLS || kind == DIRECT_TAKE) != (data != Py_None)))
        return 0;
    Py_buffer *v = PyMem_Calloc((size_t)k, sizeof(Py_buffer));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    int t = 0, rc = 0;
    if (argument_buffers(ctx, xs, v, &t) < 0) {
        PyMem_Free(v);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (kind == DIRECT_PNLS || kind == DIRECT_TAKE) {
        rc = direct_indexed(ctx, kind, bound, t, &v[0], data, y);
        goto out;
    }
    if (kind == DIRECT_LSTMC || kind == DIRECT_LSTMH) {
        rc = direct_lstm(ctx, kind, bound, t, xs, v, attrs, y);
        goto out;
    }
    if (kind == DIRECT_CONCAT) {
        rc = PyTuple_CheckExact(shape) ? direct_concat(ctx, bound, t, xs, v, attrs, shape, nodes, y) : 0;
        goto out;
    }
    if (kind == DIRECT_MATMUL && k == 2 && v[1].ndim == 3) {  /* per-node matrices, not vectors */
        rc = dg_direct_shaped(ctx, kind, code, bound, t, xs, v, attrs, shape, nodes, y);
        goto out;
    }
    if (kind == DIRECT_AFFINE || kind == DIRECT_MATMUL) {
        rc = dg_direct_products(ctx, kind == DIRECT_AFFINE, bound, t, xs, v, y);
        goto out;
    }
    if (kind == DIRECT_LSTM_STEP) {
        rc = dg_direct_lstm_step(ctx, bound, t, xs, v, attrs, y);
        goto out;
    }
    if (kind >= DIRECT_COPY) {
        rc = dg_direct_shaped(ctx, kind, code, bound, t, xs, v, attrs, shape, nodes, y);
        goto out;
    }
    Py_ssize_t lead = 0, n = v[0].len / v[0].itemsize, B = 1;
    if (kind != DIRECT_UNARY)
        B = batch_rows(v, k, &lead, &n);
    if (B == 0 || B * n > bound[t])
        goto out;
    PyObject *out = empty_like_buffer(ctx, &v[lead], t);
    Py_buffer w;
    if (!out || dg_get_buffer(out, &w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(out);
        rc = -1;
        goto out;
    }
    if (w.len != B * n * v[0].itemsize) {
        PyErr_SetString(PyExc_RuntimeError, "run_batch_native: empty made an array of another size");
        PyBuffer_Release(&w);
        Py_DECREF(out);
        rc = -1;
        goto out;
    }
    void *fn = direct_fn[kind - 1][t];
    if (kind == DIRECT_UNARY) {
        if (t == 0)
            ((unary_f32)fn)((int)code, w.buf, v[0].buf, (int64_t)n);
        else
            ((unary_f64)fn)((int)code, w.buf, v[0].buf, (int64_t)n);
    } else if (kind == DIRECT_BINARY) {
        int64_t xs_ = v[0].shape[0] > 1 ? n : 0, ys_ = v[1].shape[0] > 1 ? n : 0;
        if (t == 0)
            ((binary_f32)fn)((int)code, w.buf, v[0].buf, xs_, v[1].buf, ys_, (int64_t)B, (int64_t)n);
        else
            ((binary_f64)fn)((int)code, w.buf, v[0].buf, xs_, v[1].buf, ys_, (int64_t)B, (int64_t)n);
    } else {
        const void **args = PyMem_Malloc((size_t)k * sizeof(void *));
        int64_t *strides = PyMem_Malloc((size_t)k * sizeof(int64_t));
        if (!args || !strides) {
            PyMem_Free(args);
            PyMem_Free(strides);
            PyBuffer_Release(&w);
            Py_DECREF(out);
            PyErr_NoMemory();
            rc = -1;
            goto out;
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            args[i] = v[i].buf;
            strides[i] = v[i].shape[0] > 1 ? n : 0;
        }
        if (t == 0)
            ((sum_f32)fn)(w.buf, (const float *const *)args, strides, (int64_t)k, (int64_t)B, (int64_t)n, 1.0);
        else
            ((sum_f64)fn)(w.buf, (const double *const *)args, strides, (int64_t)k, (int64_t)B, (int64_t)n, 1.0);
        PyMem_Free(args);
        PyMem_Free(strides);
    }
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = out;
    rc = 1;
out:
    release_all(v, k);
    PyMem_Free(v);
    return rc;
}

