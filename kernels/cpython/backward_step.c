/* lstm_step's backward in the compiled backward step (part of dynagraph._bookkeeping;
backward_ops.c's NB_LSTM_STEP).

backends/cpu/lstm_step.py lstm_step_backward is the path this stands for, with the same kernels
and float operations in the same order, so both leave the same bits. For each chain of the node
(K of them side by side, BiRNNBuilder's two directions), from its part of the state's gradient
g = [g_h | g_c | g_i g_f g_o g_g g_t] (B, 7H):
    dpre = the fused kernel's backward (gates.inc dg_lstm_bwd) from dh = g_h, dc = g_c + g_t (1 - t^2),
           then + g_a a (1 - a) for the gates i, f, o and + g_g (1 - g^2), row by row;
    pre_x's gradient is dpre; W_h's is the pair (dpre, h_prev), deferred to one product per
    parameter at the end of the pass as affine's are; the previous state's is
    [dpre W_h | dc_prev | 0], dpre W_h as a product's input gradient (dg_nb_product_grad).
Only a W_h that is a parameter's one shared row is taken (else the op's own backward runs,
which gives W_h's gradient itself).
*/
#include <string.h>

#include "backward_batch.h"

enum { STATE_WIDTH = 7, KERNEL_SLOT = 10 };  /* backends/cpu/backward.py _KERNELS: dg_lstm_bwd_f32, then _f64 */

/* dc = g_c + g_t (1 - t t) for one row (the twin's numpy expression), then the fused kernel's
   backward of the row and the activations' own gradients. */
#define STEP_ROW(T, FN)                                                                                          \
    static void FN(uintptr_t fn, const T *y, const T *g, const T *cp, T *dc, T *dpre, T *dcp, Py_ssize_t H) {  \
        const T *act = y + 2 * H, *t = y + 6 * H, *gc = g + H, *ga = g + 2 * H, *gt = g + 6 * H;               \
        for (Py_ssize_t k = 0; k < H; k++)                                                                    \
            dc[k] = gc[k] + gt[k] * ((T)1 - t[k] * t[k]);                                                     \
        ((void (*)(const T *, const T *, const T *, const T *, T *, T *, int64_t, int64_t))fn)(              \
            act, cp, g, dc, dpre, dcp, 1, (int64_t)H);                                                        \
        for (Py_ssize_t k = 0; k < 3 * H; k++)                                                                \
            dpre[k] += ga[k] * (act[k] * ((T)1 - act[k]));                                                    \
        for (Py_ssize_t k = 3 * H; k < 4 * H; k++)                                                            \
            dpre[k] += ga[k] * ((T)1 - act[k] * act[k]);                                                      \
    }
STEP_ROW(float, step_row_f32)
STEP_ROW(double, step_row_f64)
#undef STEP_ROW

/* Whether plan is (LEAF, block, None): W_h a parameter's block; *b the block id (borrowed). */
static int leaf_plan(PyObject *plan, PyObject **b) {
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(plan, 0)))
        return 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(plan, 0));
    if (kind == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *b = PyTuple_GET_ITEM(plan, 1);
    return kind == LEAF;
}

enum { MAX_CHAINS = 8 };  /* the most chains one node steps that run here */

/* Chain k's part [dpre W | dcp] of the previous states' gradient out (B rows, `stride` elements
   apart; zero elsewhere): dpre W as dg_nb_product_grad makes it (the small-rows kernel for one row
   within its bound, written straight into the row; else its array, copied). 0, or -1 with an error set. */
static int chain_state_grad(PyObject *ctx, char *out, Py_ssize_t stride, PyObject *dp, const void *dpre, PyObject *W_o,
                            const void *W, const char *dcp, Py_ssize_t B, Py_ssize_t H, Py_ssize_t item) {
    if (B != 1 || !dg_nb_tgrad_into(ctx, out, W, dpre, 1, 4 * H, H)) {
        PyObject *gh = dg_nb_product_grad(ctx, dp, W_o);
        Py_ssize_t s[2];
        void *ghb;
        if (!gh || !dg_nb_operand(ctx, gh, 2, s, 1, &ghb) || s[0] != B || s[1] != H) {
            Py_XDECREF(gh);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "backward_batch_native: lstm_step's product gradient failed");
            return -1;
        }
        for (Py_ssize_t j = 0; j < B; j++)
            memcpy(out + j * stride * item, (const char *)ghb + j * H * item, (size_t)(H * item));
        Py_DECREF(gh);
    }
    for (Py_ssize_t j = 0; j < B; j++)
        memcpy(out + (j * stride + H) * item, dcp + j * H * item, (size_t)(H * item));
    return 0;
}

/* A new (B, H) array of the rows' h_prev (at prev, rows `stride` elements apart), or NULL with an error set. */
static PyObject *h_rows(PyObject *ctx, const char *prev, Py_ssize_t stride, Py_ssize_t B, Py_ssize_t H, Py_ssize_t item) {
    void *b;
    PyObject *hp = dg_nb_new_block(ctx, B, H, &b);
    for (Py_ssize_t j = 0; hp && j < B; j++)
        memcpy((char *)b + j * H * item, prev + j * stride * item, (size_t)(H * item));
    return hp;
}

/* The operands the twin takes: K pre_x (B, 4H), y and g (B, 7KH)[, K W (1, 4H, H), each a
   parameter's block (wb[k] its id), prev (B, 7KH)], all contiguous of the graph's dtype. pre[k],
   W[k], *yb, *gb, *prev: their addresses. */
static int step_operands(PyObject *ctx, PyObject *xs, PyObject *y, PyObject *g, PyObject *plans, Py_ssize_t H,
                         Py_ssize_t K, Py_ssize_t *B, void **pre, void **yb, void **gb, void **W, void **prev,
                         PyObject **wb) {
    Py_ssize_t n = PyList_GET_SIZE(xs), ps[2], ys[2], gs[2], ws[3], ss[2], S = K * STATE_WIDTH * H;
    if (!dg_nb_operand(ctx, y, 2, ys, 1, yb) || !dg_nb_operand(ctx, g, 2, gs, 1, gb) || ys[1] != S || gs[1] != S
        || gs[0] != ys[0])
        return 0;
    *B = ys[0];
    for (Py_ssize_t k = 0; k < K; k++)
        if (!dg_nb_operand(ctx, PyList_GET_ITEM(xs, k), 2, ps, 1, &pre[k]) || ps[0] != *B || ps[1] != 4 * H)
            return 0;
    if (n == K)
        return 1;
    if (!PyList_CheckExact(plans) || PyList_GET_SIZE(plans) != n)
        return 0;
    for (Py_ssize_t k = 0; k < K; k++)
        if (!dg_nb_operand(ctx, PyList_GET_ITEM(xs, K + k), 3, ws, 1, &W[k]) || ws[0] != 1 || ws[1] != 4 * H
            || ws[2] != H || !leaf_plan(PyList_GET_ITEM(plans, K + k), &wb[k]))
            return 0;
    return dg_nb_operand(ctx, PyList_GET_ITEM(xs, 2 * K), 2, ss, 1, prev) && ss[0] == *B && ss[1] == S;
}

/* (H, K) from lstm_step's attrs (H, forget_bias[, K]); 0 when they are not those. */
static int step_attrs(PyObject *attrs, Py_ssize_t *H, Py_ssize_t *K) {
    Py_ssize_t na = PyTuple_Check(attrs) ? PyTuple_GET_SIZE(attrs) : 0;
    if ((na != 2 && na != 3) || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0))
        || (na == 3 && !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 2))))
        return 0;
    *H = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0));
    *K = na == 3 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 2)) : 1;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return *H > 0 && *K > 0 && *K <= MAX_CHAINS;
}

/* Each chain's dpre (dp[k], B x 4H) and dc_prev (dcp + k B H, when full), row by row. */
static void chain_pre_grads(uintptr_t fn, int f32, Py_ssize_t K, Py_ssize_t B, Py_ssize_t H, Py_ssize_t item,
                            const char *y, const char *g, const char *prev, void **dpre, char *dc, char *dcp) {
    Py_ssize_t S = STATE_WIDTH * H, stride = K * S;
    for (Py_ssize_t k = 0; k < K; k++)
        for (Py_ssize_t j = 0; j < B; j++) {
            Py_ssize_t at = (j * stride + k * S) * item;
            const char *cp = prev ? prev + at + H * item : NULL;
            char *dr = (char *)dpre[k] + j * 4 * H * item, *dcr = prev ? dcp + (k * B + j) * H * item : NULL;
            if (f32)
                step_row_f32(fn, (const float *)(y + at), (const float *)(g + at), (const float *)cp, (float *)dc,
                             (float *)dr, (float *)dcr, H);
            else
                step_row_f64(fn, (const double *)(y + at), (const double *)(g + at), (const double *)cp, (double *)dc,
                             (double *)dr, (double *)dcr, H);
        }
}

PyObject *dg_nb_lstm_step(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g, PyObject *need,
                          PyObject *plans) {
    Py_ssize_t n = PyList_GET_SIZE(xs), B, H, K;
    void *pre[MAX_CHAINS], *W[MAX_CHAINS], *yb, *gb, *prev = NULL, *dpre[MAX_CHAINS];
    PyObject *wb[MAX_CHAINS], *dp[MAX_CHAINS] = {0}, *out = NULL;
    if (!step_attrs(attrs, &H, &K) || (n != K && n != 2 * K + 1) || PyTuple_GET_SIZE(need) != n)
        return NULL;
    if (!step_operands(ctx, xs, y, g, plans, H, K, &B, pre, &yb, &gb, W, &prev, wb)) {
        PyErr_Clear();
        return NULL;
    }
    int f32 = *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f', full = n > K;
    uintptr_t fn = dg_nb_kernel_address(ctx, KERNEL_SLOT + (f32 ? 0 : 1));
    Py_ssize_t item = f32 ? 4 : 8, S = STATE_WIDTH * H, stride = K * S;
    if (!fn)
        return NULL;
    char *dc = PyMem_Malloc((size_t)((full ? 1 + K * B : 1) * H * item)), *dcp = dc ? dc + H * item : NULL;  /* dc, dc_prev */
    if (!dc) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < K; k++)
        if (!(dp[k] = dg_nb_new_block(ctx, B, 4 * H, &dpre[k])))
            goto done;
    chain_pre_grads(fn, f32, K, B, H, item, yb, gb, full ? prev : NULL, dpre, dc, dcp);
    if (!(out = PyTuple_New(n)))
        goto done;
    for (Py_ssize_t k = 0; k < K; k++)
        PyTuple_SET_ITEM(out, k, Py_NewRef(PyTuple_GET_ITEM(need, k) == Py_True ? dp[k] : Py_None));
    if (!full)
        goto done;
    for (Py_ssize_t k = 0; k <= K; k++)
        PyTuple_SET_ITEM(out, K + k, Py_NewRef(Py_None));  /* the weights' gradients are deferred below */
    for (Py_ssize_t k = 0; k < K; k++)
        if (PyTuple_GET_ITEM(need, K + k) == Py_True) {
            PyObject *hp = h_rows(ctx, (const char *)prev + k * S * item, stride, B, H, item);
            int bad = !hp || dg_defer_pair(ctx, wb[k], dp[k], hp) < 0;
            Py_XDECREF(hp);
            if (bad)
                goto fail;
        }
    if (PyTuple_GET_ITEM(need, 2 * K) == Py_True) {
        void *ob;
        PyObject *gs = dg_nb_new_block(ctx, B, stride, &ob);
        if (!gs)
            goto fail;
        memset(ob, 0, (size_t)(B * stride * item));
        for (Py_ssize_t k = 0; k < K; k++)
            if (chain_state_grad(ctx, (char *)ob + k * S * item, stride, dp[k], dpre[k], PyList_GET_ITEM(xs, K + k), W[k],
                                 dcp + k * B * H * item, B, H, item) < 0) {
                Py_DECREF(gs);
                goto fail;
            }
        Py_DECREF(PyTuple_GET_ITEM(out, 2 * K));
        PyTuple_SET_ITEM(out, 2 * K, gs);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(dc);
    for (Py_ssize_t k = 0; k < K; k++)
        Py_XDECREF(dp[k]);
    return out;
}
