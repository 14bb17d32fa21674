/* The products' backward in the compiled backward step (part of dynagraph._bookkeeping; see
backward_ops.c, whose NB_MATMUL and NB_AFFINE call dg_nb_products).

A product W x with W a parameter's one row whose gradient was deferred: x's gradient g @ W[0]
by the small-rows kernel (rowmm.inc's dg_rows_matvec_tgrad) within NB_PRODUCT_ROWS_MAX and
NB_PRODUCT_MACS_MAX, by numpy's @ beyond, as the backend's override does
(backends/cpu/direct.py PRODUCT_BACKWARD); affine's b gets reduce_to(g, b.shape).
*/
#include "backward_batch.h"

#include <stdint.h>

typedef void (*tgrad_f32)(float *, const float *const *, const int64_t *, const int64_t *, const float *, int64_t,
                          int64_t, int64_t);
typedef void (*tgrad_f64)(double *, const double *const *, const int64_t *, const int64_t *, const double *, int64_t,
                          int64_t, int64_t);
static const int64_t ZERO_ROWS[NB_PRODUCT_ROWS_MAX];  /* every row reads matrix 0, row 0: the shared W */

/* out (n, c) = g (n, r) W (r, c) by dg_rows_matvec_tgrad where n and n*r*c are within the bounds
   (backends/cpu/direct.py _tgrad_fits): 1 when it ran, 0 when they do not fit or the kernel is
   missing (nothing written). */
int dg_nb_tgrad_into(PyObject *ctx, void *out, const void *W, const void *g, Py_ssize_t n, Py_ssize_t r, Py_ssize_t c) {
    if (n < 1 || n > NB_PRODUCT_ROWS_MAX || n * r * c > NB_PRODUCT_MACS_MAX)
        return 0;
    int f32 = *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f';
    uintptr_t fn = dg_nb_kernel_address(ctx, f32 ? 8 : 9);
    if (!fn)
        return 0;
    if (f32)
        ((tgrad_f32)fn)(out, (const float *const *)&W, ZERO_ROWS, ZERO_ROWS, g, n, r, c);
    else
        ((tgrad_f64)fn)(out, (const double *const *)&W, ZERO_ROWS, ZERO_ROWS, g, n, r, c);
    return 1;
}

/* g @ W[0] by dg_rows_matvec_tgrad for g (n, r) and W (1, r, c) C-contiguous with n and n*r*c within
   the bounds, as the backend's override (backends/cpu/direct.py _products_backward); NULL with no
   error when they do not fit. */
static PyObject *small_product_grad(PyObject *ctx, PyObject *g, PyObject *W) {
    Py_ssize_t gs[2], ws[3];
    void *gb, *wb, *out_b;
    if (!dg_nb_operand(ctx, g, 2, gs, 1, &gb) || !dg_nb_operand(ctx, W, 3, ws, 1, &wb) || ws[0] != 1 || ws[1] != gs[1]
        || gs[0] < 1 || gs[0] > NB_PRODUCT_ROWS_MAX || gs[0] * ws[1] * ws[2] > NB_PRODUCT_MACS_MAX)
        return NULL;
    if (!dg_nb_kernel_address(ctx, *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f' ? 8 : 9))
        return NULL;
    PyObject *out = dg_nb_new_block(ctx, gs[0], ws[2], &out_b);
    if (out)
        dg_nb_tgrad_into(ctx, out_b, wb, gb, gs[0], ws[1], ws[2]);
    return out;
}

/* x's gradient of the product W x: g @ W[0] (a new reference), or NULL (error set or not). */
PyObject *dg_nb_product_grad(PyObject *ctx, PyObject *g, PyObject *W) {
    PyObject *small = small_product_grad(ctx, g, W);
    if (small || PyErr_Occurred())
        return small;
    PyObject *w0 = PySequence_GetItem(W, 0);
    if (!w0)
        return NULL;
    PyObject *gx = PyNumber_MatrixMultiply(g, w0);
    Py_DECREF(w0);
    return gx;
}

/* Whether W (1, r, c) times x (n, c) fits g (n, r), W's gradient deferred (need False). */
static int product_fits(PyObject *ctx, PyObject *W, PyObject *X, PyObject *need_w, const Py_ssize_t *gs) {
    Py_ssize_t ws[3], xs[2];
    return need_w == Py_False && dg_nb_operand(ctx, W, 3, ws, 0, NULL) && dg_nb_operand(ctx, X, 2, xs, 0, NULL) && ws[0] == 1
           && ws[1] == gs[1] && xs[0] == gs[0] && xs[1] == ws[2];
}

/* NB_MATMUL and NB_AFFINE (first: the index of the first product's W; 1 for affine's b). */
PyObject *dg_nb_products(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need, Py_ssize_t first) {
    Py_ssize_t k = PyList_GET_SIZE(xs), gs[2];
    if (k < first + 2 || (k - first) % 2 || PyTuple_GET_SIZE(need) != k || !dg_nb_operand(ctx, g, 2, gs, 0, NULL))
        return NULL;
    for (Py_ssize_t i = first; i < k; i += 2)
        if (!product_fits(ctx, PyList_GET_ITEM(xs, i), PyList_GET_ITEM(xs, i + 1), PyTuple_GET_ITEM(need, i), gs))
            return NULL;
    PyObject *out = PyTuple_New(k);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *gi = Py_None;
        Py_INCREF(gi);
        if (PyTuple_GET_ITEM(need, i) == Py_True) {
            Py_DECREF(gi);
            if (i < first) {  /* affine's b: reduce_to(g, b.shape), as the reference */
                gi = dg_nb_reduced(ctx, g, PyList_GET_ITEM(xs, i));
            } else {
                gi = dg_nb_product_grad(ctx, g, PyList_GET_ITEM(xs, i - 1));
            }
            if (!gi) {
                Py_DECREF(out);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "backward_batch_native: a product's gradient failed");
                return NULL;
            }
        }
        PyTuple_SET_ITEM(out, i, gi);
    }
    return out;
}

