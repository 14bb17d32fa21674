/* Direct kernels for per-node matrices and columns (part of dynagraph._bookkeeping; called by
direct_batch.c, whose contract they keep: 1 with *y a new array, 0 when the batch does not fit,
having done nothing, -1 with an error set).

An attention step (DyNet's attention.py: colwise_add, tanh, transpose, softmax over a column,
the context's reshape into a vector) made four Python kernel calls a step of 2-8 us each,
where DyNet spends about one. These kinds take them in C:

    DIRECT_COPY     reshape and transpose where the node's values keep their memory order (the
                    shapes are the same once their axes of 1 are dropped: (n, 1) <-> (n,), and a
                    transpose moves only axes of 1: (1, n) -> (n, 1)), a copy
    DIRECT_SOFTMAX  softmax along the first axis of (n,) or (n, 1, ...) nodes: the cpu adapter's
                    kernel (overrides._softmax_forward), under the adapter's own bounds
    DIRECT_COLWISE  colwise_add: x (r, c) + b (r,) or (r, 1), one rounded add per element as numpy's
    DIRECT_MATMUL   of per-node matrices (X (k, c), not a vector): dg_small_matmul, as the cpu
                    backend's matmul twin (direct.py _products_twin) decides and computes
*/
#include <string.h>

#include "bookkeeping.h"

typedef void (*softmax_f32)(float *, const float *, int64_t, int64_t);
typedef void (*softmax_f64)(double *, const double *, int64_t, int64_t);
typedef void (*matmul_f32)(float *, const float *, int64_t, const float *, int64_t, int64_t, int64_t, int64_t,
                           int64_t);
typedef void (*matmul_f64)(double *, const double *, int64_t, const double *, int64_t, int64_t, int64_t, int64_t,
                           int64_t);

static void *softmax_fn[2], *matmul_fn[2];  /* dg_softmax_fwd_*, dg_small_matmul_*; NULL until set_direct_kernels */

void dg_set_shaped_kernels(void *softmax_f32, void *softmax_f64, void *matmul_f32, void *matmul_f64) {
    softmax_fn[0] = softmax_f32;
    softmax_fn[1] = softmax_f64;
    matmul_fn[0] = matmul_f32;
    matmul_fn[1] = matmul_f64;
}

/* The node's shape (a tuple of ints) into s (at most 8 axes): its number of axes, or -1. */
static int node_shape(PyObject *shape, Py_ssize_t *s) {
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > 8)
        return -1;
    int nd = (int)PyTuple_GET_SIZE(shape);
    for (int d = 0; d < nd; d++) {
        s[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (s[d] < 0) {
            PyErr_Clear();
            return -1;
        }
    }
    return nd;
}

/* Whether a and b (na and nb axes) are the same shape once their axes of 1 are dropped. */
int dg_same_squeezed(const Py_ssize_t *a, int na, const Py_ssize_t *b, int nb) {
    int i = 0, j = 0;
    for (;;) {
        while (i < na && a[i] == 1)
            i++;
        while (j < nb && b[j] == 1)
            j++;
        if (i == na || j == nb)
            return i == na && j == nb;
        if (a[i++] != b[j++])
            return 0;
    }
}

/* Whether transpose's permutation `dims` (attrs[0]) of a node of shape s (nd axes, padded with axes
   of 1 to len(dims)) keeps its axes longer than 1 in their order, i.e. moves only axes of 1. */
int dg_order_kept(PyObject *attrs, const Py_ssize_t *s, int nd) {
    if (!PyTuple_CheckExact(attrs) || PyTuple_GET_SIZE(attrs) != 1 || !PyTuple_CheckExact(PyTuple_GET_ITEM(attrs, 0)))
        return 0;
    PyObject *dims = PyTuple_GET_ITEM(attrs, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(dims), last = -1;
    if (n < nd)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(dims, i));
        if (d < 0 || d >= n) {
            PyErr_Clear();
            return 0;
        }
        if (d < nd && s[d] > 1) {
            if (d < last)
                return 0;
            last = d;
        }
    }
    return 1;
}

/* DIRECT_COPY (code 0 reshape, 1 transpose): one argument of B rows whose per-node shape is the
   node's up to axes of 1 (and, for transpose, a permutation that moves axes of 1 only). */
static int copy_kind(const dg_direct_ctx *ctx, long code, int t, const Py_buffer *v, PyObject *attrs,
                     PyObject *shape, Py_ssize_t B, PyObject **y) {
    Py_ssize_t s[8];
    int nd = node_shape(shape, s);
    if (nd < 0 || v->ndim < 1 || v->shape[0] != B || !dg_same_squeezed(v->shape + 1, v->ndim - 1, s, nd)
        || (code == 1 && !dg_order_kept(attrs, v->shape + 1, v->ndim - 1)))
        return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_batch(ctx, shape, B, t, v->len, &w);
    if (!made)
        return -1;
    memcpy(w.buf, v->buf, (size_t)v->len);
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}

/* DIRECT_SOFTMAX (attrs (0,)): x of B rows, per node (n,) or (n, 1, ...); the adapter's bounds:
   float32 rows of at most bound[0] classes, float64 batches of at most bound[1] elements. */
static int softmax_kind(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, const Py_buffer *v,
                        PyObject *attrs, PyObject *shape, Py_ssize_t B, PyObject **y) {
    if (!softmax_fn[t] || !PyTuple_CheckExact(attrs) || PyTuple_GET_SIZE(attrs) != 1
        || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0)) || PyLong_AsLong(PyTuple_GET_ITEM(attrs, 0)) != 0
        || v->ndim < 2 || v->shape[0] != B)
        return 0;
    Py_ssize_t n = v->shape[1], size = v->len / v->itemsize;
    for (int d = 2; d < v->ndim; d++)
        if (v->shape[d] != 1)
            return 0;
    if (n < 1 || (t == 0 ? n > bound[0] : size > bound[1]))
        return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_batch(ctx, shape, B, t, v->len, &w);
    if (!made)
        return -1;
    if (t == 0)
        ((softmax_f32)softmax_fn[0])(w.buf, v->buf, (int64_t)B, (int64_t)n);
    else
        ((softmax_f64)softmax_fn[1])(w.buf, v->buf, (int64_t)B, (int64_t)n);
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}

#define COLWISE(T, NAME)                                                                                   \
    static void NAME(T *y, const T *x, Py_ssize_t xs, const T *b, Py_ssize_t bs, Py_ssize_t B, Py_ssize_t r, \
                     Py_ssize_t c) {                                                                       \
        for (Py_ssize_t k = 0; k < B; k++)                                                                 \
            for (Py_ssize_t i = 0; i < r; i++) {                                                           \
                const T *xr = x + k * xs + i * c;                                                          \
                const T bi = b[k * bs + i];                                                                \
                T *yr = y + (k * r + i) * c;                                                               \
                for (Py_ssize_t j = 0; j < c; j++)                                                         \
                    yr[j] = xr[j] + bi;                                                                    \
            }                                                                                              \
    }
COLWISE(float, colwise_f32)
COLWISE(double, colwise_f64)
#undef COLWISE

/* DIRECT_COLWISE: x (1 or B, r, c) and b (1 or B, r) or (1 or B, r, 1); the output (B, r, c). */
static int colwise_kind(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, const Py_buffer *v,
                        PyObject *shape, Py_ssize_t B, PyObject **y) {
    const Py_buffer *x = &v[0], *b = &v[1];
    if (x->ndim != 3 || (x->shape[0] != 1 && x->shape[0] != B) || (b->ndim != 2 && b->ndim != 3)
        || (b->shape[0] != 1 && b->shape[0] != B) || b->shape[1] != x->shape[1] || (b->ndim == 3 && b->shape[2] != 1))
        return 0;
    Py_ssize_t r = x->shape[1], c = x->shape[2];
    if (B * r * c > bound[t])
        return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_batch(ctx, shape, B, t, B * r * c * x->itemsize, &w);
    if (!made)
        return -1;
    Py_ssize_t xs = x->shape[0] == 1 ? 0 : r * c, bs = b->shape[0] == 1 ? 0 : r;
    if (t == 0)
        colwise_f32(w.buf, x->buf, xs, b->buf, bs, B, r, c);
    else
        colwise_f64(w.buf, x->buf, xs, b->buf, bs, B, r, c);
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}

/* DIRECT_MATMUL of matrices: A (1 or B, r, k), X (1 or B, k, c), B * r * k * c multiply-adds
   within bound[t]; the output (B, r, c). */
static int matrix_products(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, const Py_buffer *v,
                           PyObject *shape, Py_ssize_t B, PyObject **y) {
    const Py_buffer *A = &v[0], *X = &v[1];
    if (!matmul_fn[t] || A->ndim != 3 || X->ndim != 3 || A->shape[2] != X->shape[1]
        || (A->shape[0] != 1 && A->shape[0] != B) || (X->shape[0] != 1 && X->shape[0] != B))
        return 0;
    Py_ssize_t r = A->shape[1], k = A->shape[2], c = X->shape[2];
    if (r < 1 || k < 1 || c < 1 || B * r * k * c > bound[t])
        return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_batch(ctx, shape, B, t, B * r * c * A->itemsize, &w);
    if (!made)
        return -1;
    int64_t as = A->shape[0] == 1 ? 0 : r * k, xs = X->shape[0] == 1 ? 0 : k * c;
    if (t == 0)
        ((matmul_f32)matmul_fn[0])(w.buf, A->buf, as, X->buf, xs, (int64_t)B, (int64_t)r, (int64_t)k, (int64_t)c);
    else
        ((matmul_f64)matmul_fn[1])(w.buf, A->buf, as, X->buf, xs, (int64_t)B, (int64_t)r, (int64_t)k, (int64_t)c);
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}

int dg_direct_shaped(const dg_direct_ctx *ctx, long kind, long code, const Py_ssize_t *bound, int t, PyObject *xs,
                     const Py_buffer *v, PyObject *attrs, PyObject *shape, Py_ssize_t B, PyObject **y) {
    Py_ssize_t k = PyList_GET_SIZE(xs);
    if (!PyTuple_CheckExact(shape))
        return 0;
    switch (kind) {
    case DIRECT_COPY:
        return k == 1 ? copy_kind(ctx, code, t, v, attrs, shape, B, y) : 0;
    case DIRECT_SOFTMAX:
        return k == 1 ? softmax_kind(ctx, bound, t, v, attrs, shape, B, y) : 0;
    case DIRECT_COLWISE:
        return k == 2 ? colwise_kind(ctx, bound, t, v, shape, B, y) : 0;
    case DIRECT_MATMUL:
        return k == 2 ? matrix_products(ctx, bound, t, v, shape, B, y) : 0;
    default:
        return 0;
    }
}
