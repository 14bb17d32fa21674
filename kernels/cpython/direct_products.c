/* The compiled batch step's products (part of dynagraph._bookkeeping; see direct_batch.c, which
calls dg_direct_products for the DIRECT_AFFINE and DIRECT_MATMUL descriptors).

affine (b, W1, x1, W2, x2, ...) and matmul (W, x) with every W one shared matrix: with few rows
the small-rows kernel (rowmm.inc's dg_rows_matvec, registered by set_direct_kernels), else the
op's own numpy calls; backends/cpu/direct.py's _products_twin is the Python twin of both.
*/
#include "bookkeeping.h"

static PyObject *NAME_T;  /* "T", interned (dg_attr) */

#include <stdint.h>

/* dg_rows_matvec_f32/f64: products of a shared matrix with a few rows */
static void *matvec_fn[2];
typedef void (*matvec_f32)(float *, const float *const *, const int64_t *, const int64_t *, const float *, int64_t,
                           int64_t, int64_t, int64_t);
typedef void (*matvec_f64)(double *, const double *const *, const int64_t *, const int64_t *, const double *, int64_t,
                           int64_t, int64_t, int64_t);
/* the most rows of x that take matvec_fn (backends/cpu/direct.py PRODUCT_ROWS_MAX); the
   descriptor's bound caps the multiply-adds, all products together */
enum { MATVEC_ROWS_MAX = 4 };
static const int64_t ZERO_ROWS[MATVEC_ROWS_MAX];  /* every row reads matrix 0, row 0: the shared W */

void dg_set_matvec_kernels(void *f32, void *f64) {
    matvec_fn[0] = f32;
    matvec_fn[1] = f64;
}

/* affine (DIRECT_AFFINE: b, W1, x1, W2, x2, ...) and matmul (DIRECT_MATMUL: W, x) with every W a
   shared matrix (1, r, c) and every x a batch of vectors (n, c): the op's own numpy code
   (ops/linalg.py: y = x1 @ W1[0].T; y += x2 @ W2[0].T ...; y += b) made through numpy's number
   protocol, without its Python frames: the same calls on the same operands, so the same
   values. b: (1 or n, r) with every x of n rows. At most MATVEC_ROWS_MAX rows and bound[t]
   multiply-adds take dg_rows_matvec instead (small_products), as the backend's twin does
   (backends/cpu/direct.py _products_twin).
   As direct_batch: 1 with *y, 0, -1. */
static int small_products(const dg_direct_ctx *ctx, int affine, int t, Py_ssize_t k, const Py_buffer *v,
                          Py_ssize_t n, Py_ssize_t r, PyObject **y);

int dg_direct_products(const dg_direct_ctx *ctx, int affine, const Py_ssize_t *bound, int t, PyObject *xs,
                       const Py_buffer *v, PyObject **y) {
    Py_ssize_t k = PyList_GET_SIZE(xs), first = affine ? 1 : 0;
    if (affine ? (k < 3 || k % 2 == 0) : k != 2)
        return 0;
    Py_ssize_t r = v[first].ndim == 3 ? v[first].shape[1] : -1, n = v[first + 1].shape[0];
    for (Py_ssize_t i = first; i < k; i += 2)
        if (v[i].ndim != 3 || v[i].shape[0] != 1 || v[i].shape[1] != r || v[i + 1].ndim != 2
            || v[i + 1].shape[0] != n || v[i + 1].shape[1] != v[i].shape[2])
            return 0;
    if (affine && (v[0].ndim != 2 || v[0].shape[1] != r || (v[0].shape[0] != 1 && v[0].shape[0] != n)))
        return 0;
    Py_ssize_t macs = 0;
    for (Py_ssize_t i = first; i < k; i += 2)
        macs += n * r * v[i].shape[2];
    if (n >= 1 && n <= MATVEC_ROWS_MAX && macs <= bound[t] && matvec_fn[t])
        return small_products(ctx, affine, t, k, v, n, r, y);
    PyObject *out = NULL;
    for (Py_ssize_t i = first; i < k; i += 2) {
        PyObject *w0 = PySequence_GetItem(PyList_GET_ITEM(xs, i), 0);
        PyObject *wt = w0 ? dg_attr(w0, &NAME_T, "T") : NULL;
        PyObject *p = wt ? PyNumber_MatrixMultiply(PyList_GET_ITEM(xs, i + 1), wt) : NULL;
        Py_XDECREF(w0);
        Py_XDECREF(wt);
        if (p && out)
            Py_SETREF(out, PyNumber_InPlaceAdd(out, p));  /* y += p: a fresh product, as the op's code */
        else if (p)
            out = Py_NewRef(p);
        Py_XDECREF(p);
        if (!p || !out) {
            Py_XDECREF(out);
            return -1;
        }
    }
    if (affine) {
        Py_SETREF(out, PyNumber_InPlaceAdd(out, PyList_GET_ITEM(xs, 0)));
        if (!out)
            return -1;
    }
    *y = out;
    return 1;
}

/* dst (rows, width) += src rows, src row j at src + j * step (step 0: one row for all); t 0 float32,
   1 float64. One IEEE add per element, as numpy's in-place add. */
static void add_rows(int t, void *dst, const void *src, Py_ssize_t rows, Py_ssize_t width, Py_ssize_t step) {
    for (Py_ssize_t j = 0; j < rows; j++) {
        if (t == 0) {
            float *d = (float *)dst + j * width;
            const float *s = (const float *)src + j * step;
            for (Py_ssize_t e = 0; e < width; e++)
                d[e] += s[e];
        } else {
            double *d = (double *)dst + j * width;
            const double *s = (const double *)src + j * step;
            for (Py_ssize_t e = 0; e < width; e++)
                d[e] += s[e];
        }
    }
}

/* The products of direct_products for n <= bound rows: y = x1 W1^T, then y += xi Wi^T (each made
   into tmp first, as the twin's y += p) and y += b, every element one IEEE add in the twin's order. */
static int small_products(const dg_direct_ctx *ctx, int affine, int t, Py_ssize_t k, const Py_buffer *v,
                          Py_ssize_t n, Py_ssize_t r, PyObject **y) {
    Py_ssize_t first = affine ? 1 : 0, size = t ? 8 : 4;
    PyObject *shape = dg_tuple_nn(n, r);
    PyObject *out = shape ? dg_direct_empty_of(ctx, shape, t) : NULL;
    Py_XDECREF(shape);
    Py_buffer w;
    if (!out || dg_get_buffer(out, &w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(out);
        return -1;
    }
    char *tmp = k - first > 2 ? PyMem_Malloc((size_t)(n * r * size)) : NULL;
    if (k - first > 2 && !tmp) {
        PyBuffer_Release(&w);
        Py_DECREF(out);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = first; i < k; i += 2) {
        const void *base = v[i].buf;
        void *dst = i == first ? w.buf : tmp;
        Py_ssize_t c = v[i].shape[2];
        if (t == 0)
            ((matvec_f32)matvec_fn[0])(dst, (const float *const *)&base, ZERO_ROWS, ZERO_ROWS, v[i + 1].buf, c, n, r, c);
        else
            ((matvec_f64)matvec_fn[1])(dst, (const double *const *)&base, ZERO_ROWS, ZERO_ROWS, v[i + 1].buf, c, n, r, c);
        if (i != first)
            add_rows(t, w.buf, tmp, n, r, r);
    }
    PyMem_Free(tmp);
    if (affine)
        add_rows(t, w.buf, v[0].buf, n, r, v[0].shape[0] == 1 ? 0 : r);  /* + b, one row or n */
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = out;
    return 1;
}

