/* lstm_step's forward in the compiled batch step (part of dynagraph._bookkeeping; direct_batch.c
calls dg_direct_lstm_step for the DIRECT_LSTM_STEP descriptor).

ops/cells.py defines the op: per chain k of K, from pre_x (B, 4H), W_h (1, 4H, H) and its part
of the previous state (B, 7KH), its state [h | c | i f o g tanh(c)]. The gates are b + W x as the
affine's direct products make them (up to four rows the small-rows kernel reading h_prev in
place, else dg_direct_products on h_prev copied out), then the fused LSTM kernel (gates.inc
dg_lstm_fwd) writes c, h and the activations straight into the chain's part of each state row. backends/cpu/lstm_step.py's lstm_step_forward is the twin: the same product,
the same kernel over the batch at once (the kernel works row by row), so the same bits.
*/
#include <string.h>

#include "bookkeeping.h"

typedef void (*cell_f32)(const float *, const float *, float *, float *, float *, int64_t, int64_t, double);
typedef void (*cell_f64)(const double *, const double *, double *, double *, double *, int64_t, int64_t, double);
static void *cell_fn[2];  /* dg_lstm_fwd_f32 / _f64, set by set_direct_kernels */

enum { STATE_WIDTH = 7 };  /* ops/cells.py STATE_WIDTH: h, c and five activations, in units of H */

void dg_set_step_kernels(void *f32, void *f64) {
    cell_fn[0] = f32;
    cell_fn[1] = f64;
}

/* A new (B, H) array of the rows' h_prev (the first H elements of each state row, at `prev`,
   rows `stride` elements apart), with its buffer. */
static PyObject *h_of(const dg_direct_ctx *ctx, int t, const char *prev, Py_ssize_t stride, Py_ssize_t item,
                      Py_ssize_t B, Py_ssize_t H, Py_buffer *hv) {
    PyObject *hp = dg_direct_new_rows(ctx, B, H, t, hv);
    if (!hp)
        return NULL;
    for (Py_ssize_t j = 0; j < B; j++)
        memcpy((char *)hv->buf + j * H * item, prev + j * stride * item, (size_t)(H * item));
    return hp;
}

/* One chain's gates b + W h_prev (B, 4H) by dg_direct_products (pre: its pre_x, W: its weight,
   with their objects), as a new reference with its buffer in *gv; NULL with *declined set when
   the products do not take the operands, NULL with an error set on failure. */
static PyObject *gates_of(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, PyObject *pre_o, PyObject *W_o,
                          const Py_buffer *pre, const Py_buffer *W, const char *prev, Py_ssize_t stride,
                          Py_ssize_t B, Py_ssize_t H, Py_buffer *gv, int *declined) {
    Py_buffer pv[3] = {*pre, *W};
    PyObject *hp = h_of(ctx, t, prev, stride, pre->itemsize, B, H, &pv[2]);
    if (!hp)
        return NULL;
    PyObject *args = PyList_New(3), *gates = NULL;
    if (args) {
        PyList_SET_ITEM(args, 0, Py_NewRef(pre_o));
        PyList_SET_ITEM(args, 1, Py_NewRef(W_o));
        PyList_SET_ITEM(args, 2, Py_NewRef(hp));
        int rc = dg_direct_products(ctx, 1, bound, t, args, pv, &gates);
        Py_DECREF(args);
        if (rc == 0)
            *declined = 1;
        if (rc <= 0)
            gates = NULL;
    }
    PyBuffer_Release(&pv[2]);
    Py_DECREF(hp);
    if (gates && dg_get_buffer(gates, gv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_CLEAR(gates);
        PyErr_Clear();
        *declined = 1;  /* not a plain array: the twin decides (it makes the same one) */
    } else if (gates && (gv->ndim != 2 || gv->shape[0] != B || gv->shape[1] != 4 * H || gv->itemsize != pre->itemsize)) {
        PyBuffer_Release(gv);
        Py_CLEAR(gates);
        *declined = 1;
    }
    return gates;
}

/* One chain's gates for B <= 4 rows where the small-rows kernel takes the product (dg_direct_products'
   rule: two to four rows, or one within the bound): gates = W h_prev, h_prev read in place from the
   states (rows `stride` elements apart), then + pre_x, one add per element, as small_products makes
   them (and the twin: the same kernel, then numpy's +=). A PyMem buffer, or NULL with *declined set
   when the rule says BLAS, NULL with an error set on failure. */
static char *small_gates(const Py_ssize_t *bound, int t, const void *pre, const void *W, const char *prev,
                         Py_ssize_t stride, Py_ssize_t item, Py_ssize_t B, Py_ssize_t H, int *declined) {
    if (B > 4 || (B == 1 && 4 * H * H > bound[t])) {
        *declined = 1;
        return NULL;
    }
    char *g = PyMem_Malloc((size_t)(B * 4 * H * item));
    if (!g) {
        PyErr_NoMemory();
        return NULL;
    }
    if (dg_shared_matvec(t, g, W, prev, stride, B, 4 * H, H) < 0) {
        PyMem_Free(g);
        *declined = 1;
        return NULL;
    }
    dg_add_row_block(t, g, pre, B, 4 * H, 4 * H);
    return g;
}

/* Chain k of K: its gates, then the fused cell row by row into its part of each state row of w
   (rows K * 7H apart). 0, or -1 with an error set; *declined when the products decline. */
static int one_chain(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, PyObject *xs, const Py_buffer *v,
                     Py_ssize_t K, Py_ssize_t k, Py_ssize_t B, Py_ssize_t H, double fb, char *w, int *declined) {
    Py_ssize_t item = v[0].itemsize, S = STATE_WIDTH * H, stride = K * S;
    int full = PyList_GET_SIZE(xs) > K;
    const char *prev = full ? (const char *)v[2 * K].buf + k * S * item : NULL;
    PyObject *gates = NULL;
    Py_buffer gv;
    const char *gp = v[k].buf;
    char *small = NULL;
    if (full) {
        if ((small = small_gates(bound, t, v[k].buf, v[K + k].buf, prev, stride, item, B, H, declined))) {
            gp = small;
        } else if (!*declined) {
            return -1;
        } else {
            *declined = 0;
            gates = gates_of(ctx, bound, t, PyList_GET_ITEM(xs, k), PyList_GET_ITEM(xs, K + k), &v[k], &v[K + k], prev,
                             stride, B, H, &gv, declined);
            if (!gates)
                return -1;
            gp = gv.buf;
        }
    }
    for (Py_ssize_t j = 0; j < B; j++) {  /* row by row: c, h and the activations go into the state's row */
        const char *g = gp + j * 4 * H * item, *cp = full ? prev + (j * stride + H) * item : NULL;
        char *s = w + (j * stride + k * S) * item;
        if (t == 0)
            ((cell_f32)cell_fn[0])((const float *)g, (const float *)cp, (float *)(s + H * item), (float *)s,
                                   (float *)(s + 2 * H * item), 1, (int64_t)H, fb);
        else
            ((cell_f64)cell_fn[1])((const double *)g, (const double *)cp, (double *)(s + H * item), (double *)s,
                                   (double *)(s + 2 * H * item), 1, (int64_t)H, fb);
    }
    if (gates) {
        PyBuffer_Release(&gv);
        Py_DECREF(gates);
    }
    PyMem_Free(small);
    return 0;
}

/* lstm_step (DIRECT_LSTM_STEP): K pre_x (B, 4H)[, K W (1, 4H, H), state (B, 7KH)]; attrs
   (H, forget_bias[, K]). As dg_direct_batch: 1 with *y, 0 when it does not fit, -1 on error. */
int dg_direct_lstm_step(const dg_direct_ctx *ctx, const Py_ssize_t *bound, int t, PyObject *xs, const Py_buffer *v,
                        PyObject *attrs, PyObject **y) {
    Py_ssize_t n = PyList_GET_SIZE(xs), na = PyTuple_Check(attrs) ? PyTuple_GET_SIZE(attrs) : 0;
    if (!cell_fn[t] || (na != 2 && na != 3))
        return 0;
    Py_ssize_t H = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0)), K = na == 3 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 2)) : 1;
    double fb = PyFloat_AsDouble(PyTuple_GET_ITEM(attrs, 1));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (H <= 0 || K <= 0 || (n != K && n != 2 * K + 1))
        return 0;
    Py_ssize_t B = v[0].shape[0], S = STATE_WIDTH * H;
    for (Py_ssize_t k = 0; k < K; k++)
        if (v[k].ndim != 2 || v[k].shape[0] != B || v[k].shape[1] != 4 * H
            || (n > K && (v[K + k].ndim != 3 || v[K + k].shape[0] != 1 || v[K + k].shape[1] != 4 * H || v[K + k].shape[2] != H)))
            return 0;
    if (n > K && (v[2 * K].ndim != 2 || v[2 * K].shape[0] != B || v[2 * K].shape[1] != K * S))
        return 0;
    Py_buffer w;
    PyObject *made = dg_direct_new_rows(ctx, B, K * S, t, &w);
    if (!made)
        return -1;
    int declined = 0;
    for (Py_ssize_t k = 0; k < K; k++)
        if (one_chain(ctx, bound, t, xs, v, K, k, B, H, fb, w.buf, &declined) < 0) {
            PyBuffer_Release(&w);
            Py_DECREF(made);
            return declined && !PyErr_Occurred() ? 0 : -1;
        }
    dg_direct_mark_ready(ctx, &w, t);
    PyBuffer_Release(&w);
    *y = made;
    return 1;
}
