/* The compiled batch step's products (part of dynagraph._bookkeeping; see direct_batch.c, which
calls dg_direct_products for the DIRECT_AFFINE and DIRECT_MATMUL descriptors).

affine (b, W1, x1, W2, x2, ...) and matmul (W, x) with every W one shared matrix: with few rows
the small-rows kernel (rowmm.inc's dg_rows_matvec, registered by set_direct_kernels); with more
rows than it takes, BLAS against W transposed into a C-contiguous copy (x @ W^T as x @ Wt: made
once per weight and evaluation, see transposed_weight); else the op's own numpy calls.
backends/cpu/direct.py's _products_twin is the Python twin of all three.
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

/* y (n, r) = x W^T, W (r, c) one shared matrix, the rows of x xstride elements apart, by the
   small-rows kernel (n <= MATVEC_ROWS_MAX). 0, or -1 when the kernel is not registered. */
int dg_shared_matvec(int t, void *y, const void *W, const void *x, Py_ssize_t xstride, Py_ssize_t n, Py_ssize_t r,
                     Py_ssize_t c) {
    if (!matvec_fn[t] || n > MATVEC_ROWS_MAX)
        return -1;
    if (t == 0)
        ((matvec_f32)matvec_fn[0])(y, (const float *const *)&W, ZERO_ROWS, ZERO_ROWS, x, xstride, n, r, c);
    else
        ((matvec_f64)matvec_fn[1])(y, (const double *const *)&W, ZERO_ROWS, ZERO_ROWS, x, xstride, n, r, c);
    return 0;
}

/* affine (DIRECT_AFFINE: b, W1, x1, W2, x2, ...) and matmul (DIRECT_MATMUL: W, x) with every W a
   shared matrix (1, r, c) and every x a batch of vectors (n, c): the op's own numpy code
   (ops/linalg.py: y = x1 @ W1[0].T; y += x2 @ W2[0].T ...; y += b) made through numpy's number
   protocol, without its Python frames: the same calls on the same operands, so the same
   values. b: (1 or n, r) with every x of n rows. Two to MATVEC_ROWS_MAX rows, or one row and bound[t]
   multiply-adds take dg_rows_matvec instead (small_products), as the backend's twin does
   (backends/cpu/direct.py _products_twin).
   As direct_batch: 1 with *y, 0, -1. */
static int small_products(const dg_direct_ctx *ctx, int affine, int t, Py_ssize_t k, const Py_buffer *v,
                          Py_ssize_t n, Py_ssize_t r, PyObject **y);

/* dst (c, r) = src (r, c) transposed, both C-contiguous, in 8 x 8 tiles, each written along dst's
   rows: 2.3 ms for TreeLSTM's 2560 x 1024 at H=512, where 32 x 32 tiles read along src's rows
   took 3.8 ms and numpy's copy of W.T 16 ms. */
#define TILE 8
#define TRANSPOSE(T)                                                                            \
    do {                                                                                        \
        const T *s_ = (const T *)src;                                                           \
        T *d_ = (T *)dst;                                                                       \
        for (Py_ssize_t i0 = 0; i0 < r; i0 += TILE)                                             \
            for (Py_ssize_t j0 = 0; j0 < c; j0 += TILE) {                                       \
                Py_ssize_t i1 = i0 + TILE < r ? i0 + TILE : r, j1 = j0 + TILE < c ? j0 + TILE : c; \
                for (Py_ssize_t j = j0; j < j1; j++)                                            \
                    for (Py_ssize_t i = i0; i < i1; i++)                                        \
                        d_[j * r + i] = s_[i * c + j];                                          \
            }                                                                                   \
    } while (0)

#if defined(__SSE__)
#include <xmmintrin.h>
/* float32 in 4 x 4 blocks of SSE registers (x86-64's baseline, which this module is built for),
   walked in TILE x TILE tiles as above; the edges of a shape that is not a multiple of 4 go
   element by element. An exact copy either way (the per-sentence hoisted input products
   transpose each weight once per sentence: about 0.35 ns an element element by element). */
static void transpose_f32(float *d_, const float *s_, Py_ssize_t r, Py_ssize_t c) {
    Py_ssize_t r4 = r & ~(Py_ssize_t)3, c4 = c & ~(Py_ssize_t)3;
    for (Py_ssize_t i0 = 0; i0 < r4; i0 += 4 * TILE)
        for (Py_ssize_t j0 = 0; j0 < c4; j0 += 4 * TILE) {
            Py_ssize_t i1 = i0 + 4 * TILE < r4 ? i0 + 4 * TILE : r4, j1 = j0 + 4 * TILE < c4 ? j0 + 4 * TILE : c4;
            for (Py_ssize_t j = j0; j < j1; j += 4)
                for (Py_ssize_t i = i0; i < i1; i += 4) {
                    __m128 a = _mm_loadu_ps(s_ + i * c + j), b = _mm_loadu_ps(s_ + (i + 1) * c + j);
                    __m128 e = _mm_loadu_ps(s_ + (i + 2) * c + j), f = _mm_loadu_ps(s_ + (i + 3) * c + j);
                    _MM_TRANSPOSE4_PS(a, b, e, f);
                    _mm_storeu_ps(d_ + j * r + i, a);
                    _mm_storeu_ps(d_ + (j + 1) * r + i, b);
                    _mm_storeu_ps(d_ + (j + 2) * r + i, e);
                    _mm_storeu_ps(d_ + (j + 3) * r + i, f);
                }
        }
    for (Py_ssize_t i = 0; i < r; i++)  /* the edges: rows past r4, columns past c4 */
        for (Py_ssize_t j = i < r4 ? c4 : 0; j < c; j++)
            d_[j * r + i] = s_[i * c + j];
}
#endif

static void transpose_into(int t, void *dst, const void *src, Py_ssize_t r, Py_ssize_t c) {
#if defined(__SSE__)
    if (t == 0) {
        transpose_f32(dst, src, r, c);
        return;
    }
#endif
    if (t == 0)
        TRANSPOSE(float);
    else
        TRANSPOSE(double);
}
#undef TILE
#undef TRANSPOSE

/* W[0] (r, c) of a shared weight w (1, r, c), buffer v, as a new C-contiguous (c, r) array Wt.
   BLAS runs x @ Wt (plain row-major operands) 1.1-2.5x faster than x @ W[0].T on a few to a
   few dozen rows at H=64-512 (OpenBLAS repacks the transposed W on every call, bench/swap's
   TreeLSTM inference at H=512: 16% of a profile's samples), and the twin computes the same product the same way.
   Within one evaluation a weight is read by batch after batch (a tree's levels, a sequence's
   steps), so the copy is made once: ctx->transposed (a dict for the evaluation, or NULL) maps
   W's address to (w, Wt). Holding w keeps its memory from being freed or handed out again
   (the block pool reuses only arrays nothing else holds), and a value is never written after
   it is made, so the address names the same contents until the dict goes with the evaluation.
   A new reference, or NULL with an error set. */
static PyObject *transposed_weight(const dg_direct_ctx *ctx, int t, PyObject *w, const Py_buffer *v) {
    Py_ssize_t r = v->shape[1], c = v->shape[2];
    PyObject *key = NULL;
    if (ctx->transposed) {
        key = PyLong_FromVoidPtr(v->buf);
        PyObject *hit = key ? PyDict_GetItemWithError(ctx->transposed, key) : NULL;  /* borrowed */
        Py_ssize_t dims[2];
        if (hit && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 2
            && dg_array_dims(PyTuple_GET_ITEM(hit, 1), 2, dims) == 2 && dims[0] == c && dims[1] == r) {
            Py_DECREF(key);
            return Py_NewRef(PyTuple_GET_ITEM(hit, 1));
        }
        if (!key || PyErr_Occurred()) {
            Py_XDECREF(key);
            return NULL;
        }
    }
    PyObject *shape = dg_tuple_nn(c, r);
    PyObject *argv[2] = {shape, ctx->dtypes[t]};
    PyObject *wt = shape ? PyObject_Vectorcall(ctx->empty, argv, 2, NULL) : NULL;  /* numpy.empty: not pooled */
    Py_XDECREF(shape);
    Py_buffer b;
    if (!wt || dg_get_buffer(wt, &b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(wt);
        Py_XDECREF(key);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    transpose_into(t, b.buf, v->buf, r, c);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (key) {
        PyObject *entry = PyTuple_Pack(2, w, wt);
        int bad = !entry || PyDict_SetItem(ctx->transposed, key, entry) < 0;
        Py_XDECREF(entry);
        Py_DECREF(key);
        if (bad)
            Py_CLEAR(wt);
    }
    return wt;
}

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
    /* one row: the kernel up to the bound (BLAS's gemv ties beyond); two to four rows: always,
       since the kernel reads a shared W once for all of them and BLAS's x @ W.T repacks it */
    if (n >= 1 && n <= MATVEC_ROWS_MAX && (n > 1 || macs <= bound[t]) && matvec_fn[t])
        return small_products(ctx, affine, t, k, v, n, r, y);
    PyObject *out = NULL;
    for (Py_ssize_t i = first; i < k; i += 2) {
        PyObject *wt;
        if (n > MATVEC_ROWS_MAX) {
            wt = transposed_weight(ctx, t, PyList_GET_ITEM(xs, i), &v[i]);
        } else {  /* a row or a few against a large W: one pass over W as it lies (BLAS's gemv) */
            PyObject *w0 = PySequence_GetItem(PyList_GET_ITEM(xs, i), 0);
            wt = w0 ? dg_attr(w0, &NAME_T, "T") : NULL;
            Py_XDECREF(w0);
        }
        PyObject *p = wt ? PyNumber_MatrixMultiply(PyList_GET_ITEM(xs, i + 1), wt) : NULL;
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
void dg_add_row_block(int t, void *dst, const void *src, Py_ssize_t rows, Py_ssize_t width, Py_ssize_t step) {
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
    Py_buffer w;
    PyObject *out = dg_direct_new_rows(ctx, n, r, t, &w);
    if (!out)
        return -1;
    char *tmp = k - first > 2 ? PyMem_Malloc((size_t)(n * r * size)) : NULL;
    if (k - first > 2 && !tmp) {
        PyBuffer_Release(&w);
        Py_DECREF(out);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = first; i < k; i += 2) {
        void *dst = i == first ? w.buf : tmp;
        Py_ssize_t c = v[i].shape[2];
        dg_shared_matvec(t, dst, v[i].buf, v[i + 1].buf, c, n, r, c);  /* registered: checked by the caller */
        if (i != first)
            dg_add_row_block(t, w.buf, tmp, n, r, r);
    }
    PyMem_Free(tmp);
    if (affine)
        dg_add_row_block(t, w.buf, v[0].buf, n, r, v[0].shape[0] == 1 ? 0 : r);  /* + b, one row or n */
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = out;
    return 1;
}

