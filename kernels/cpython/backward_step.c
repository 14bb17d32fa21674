/* lstm_step's backward in the compiled backward step (part of dynagraph._bookkeeping;
backward_ops.c's NB_LSTM_STEP).

backends/cpu/lstm_step.py lstm_step_backward is the path this stands for, with the same kernels
and float operations in the same order, so both leave the same bits. From the state's gradient
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

typedef void (*tgrad_f32)(float *, const float *const *, const int64_t *, const int64_t *, const float *, int64_t,
                          int64_t, int64_t);
typedef void (*tgrad_f64)(double *, const double *const *, const int64_t *, const int64_t *, const double *, int64_t,
                          int64_t, int64_t);
static const int64_t ROW0[1];  /* the one row reads matrix 0, row 0: the shared W */

/* One node's [dpre W | dcp | 0] (1, 7H) with dpre W written by the small-rows kernel straight into
   the state's row (the product as dg_nb_product_grad makes it for one row within its bound, so
   the same bits); NULL with no error when the product is beyond that bound. */
static PyObject *one_state_grad(PyObject *ctx, const void *dpre, const void *W, const char *dcp, Py_ssize_t H,
                                Py_ssize_t item, int f32) {
    uintptr_t fn = dg_nb_kernel_address(ctx, f32 ? 8 : 9);  /* dg_rows_matvec_tgrad */
    void *out_b;
    PyObject *out;
    if (!fn || 4 * H * H > NB_PRODUCT_MACS_MAX || !(out = dg_nb_new_block(ctx, 1, STATE_WIDTH * H, &out_b)))
        return NULL;
    memset((char *)out_b + H * item, 0, (size_t)((STATE_WIDTH - 1) * H * item));
    if (f32)
        ((tgrad_f32)fn)(out_b, (const float *const *)&W, ROW0, ROW0, dpre, 1, 4 * H, H);
    else
        ((tgrad_f64)fn)(out_b, (const double *const *)&W, ROW0, ROW0, dpre, 1, 4 * H, H);
    memcpy((char *)out_b + H * item, dcp, (size_t)(H * item));
    return out;
}

/* The previous state's gradient [dpre W | dcp | 0] (B, 7H), a new reference, or NULL with an error set. */
static PyObject *state_grad(PyObject *ctx, PyObject *dp, PyObject *W, const char *dcp, Py_ssize_t B, Py_ssize_t H,
                            Py_ssize_t item) {
    PyObject *gh = dg_nb_product_grad(ctx, dp, W);
    if (!gh) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "backward_batch_native: lstm_step's product gradient failed");
        return NULL;
    }
    Py_ssize_t s[2];
    void *ghb, *out_b;
    PyObject *out = NULL;
    if (!dg_nb_operand(ctx, gh, 2, s, 1, &ghb) || s[0] != B || s[1] != H) {
        PyErr_SetString(PyExc_RuntimeError, "backward_batch_native: lstm_step's product gradient of another shape");
    } else if ((out = dg_nb_new_block(ctx, B, STATE_WIDTH * H, &out_b))) {
        memset(out_b, 0, (size_t)(B * STATE_WIDTH * H * item));
        for (Py_ssize_t j = 0; j < B; j++) {
            char *row = (char *)out_b + j * STATE_WIDTH * H * item;
            memcpy(row, (const char *)ghb + j * H * item, (size_t)(H * item));
            memcpy(row + H * item, dcp + j * H * item, (size_t)(H * item));
        }
    }
    Py_DECREF(gh);
    return out;
}

/* A new (B, H) array of each state row's first H elements (h_prev), or NULL with an error set. */
static PyObject *h_rows(PyObject *ctx, const char *prev, Py_ssize_t B, Py_ssize_t H, Py_ssize_t item) {
    void *b;
    PyObject *hp = dg_nb_new_block(ctx, B, H, &b);
    for (Py_ssize_t j = 0; hp && j < B; j++)
        memcpy((char *)b + j * H * item, prev + j * STATE_WIDTH * H * item, (size_t)(H * item));
    return hp;
}

/* Whether the operands are the twin's: pre (B, 4H), y and g (B, 7H)[, W (1, 4H, H) a parameter's
   block (*wb its id), prev (B, 7H)], all contiguous of the graph's dtype. */
static int step_operands(PyObject *ctx, PyObject *xs, PyObject *y, PyObject *g, PyObject *plans, Py_ssize_t H,
                         Py_ssize_t *B, void **p, PyObject **wb) {
    Py_ssize_t k = PyList_GET_SIZE(xs), ps[2], ys[2], gs[2], ws[3], ss[2];
    if (!dg_nb_operand(ctx, PyList_GET_ITEM(xs, 0), 2, ps, 1, &p[0]) || !dg_nb_operand(ctx, y, 2, ys, 1, &p[1])
        || !dg_nb_operand(ctx, g, 2, gs, 1, &p[2]) || ps[1] != 4 * H || ys[0] != ps[0] || gs[0] != ps[0]
        || ys[1] != STATE_WIDTH * H || gs[1] != STATE_WIDTH * H)
        return 0;
    *B = ps[0];
    if (k == 1)
        return 1;
    return dg_nb_operand(ctx, PyList_GET_ITEM(xs, 1), 3, ws, 1, &p[3]) && ws[0] == 1 && ws[1] == 4 * H && ws[2] == H
           && dg_nb_operand(ctx, PyList_GET_ITEM(xs, 2), 2, ss, 1, &p[4]) && ss[0] == *B && ss[1] == STATE_WIDTH * H
           && PyList_CheckExact(plans) && PyList_GET_SIZE(plans) == 3 && leaf_plan(PyList_GET_ITEM(plans, 1), wb);
}

PyObject *dg_nb_lstm_step(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g, PyObject *need,
                          PyObject *plans) {
    Py_ssize_t k = PyList_GET_SIZE(xs), B, H;
    void *p[5] = {0};
    PyObject *wb = NULL;
    if ((k != 1 && k != 3) || PyTuple_GET_SIZE(need) != k || !PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) != 2
        || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0)))
        return NULL;
    H = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0));
    if (H <= 0 || !step_operands(ctx, xs, y, g, plans, H, &B, p, &wb)) {
        PyErr_Clear();
        return NULL;
    }
    int f32 = *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f';
    uintptr_t fn = dg_nb_kernel_address(ctx, KERNEL_SLOT + (f32 ? 0 : 1));
    Py_ssize_t item = f32 ? 4 : 8;
    if (!fn)
        return NULL;
    void *dpre;
    PyObject *dp = dg_nb_new_block(ctx, B, 4 * H, &dpre), *out = NULL;
    char *dc = PyMem_Malloc((size_t)((k == 3 ? B + 1 : 1) * H * item)), *dcp = dc ? dc + H * item : NULL;  /* dc, dc_prev */
    if (!dp || !dc) {
        if (!dc)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < B; j++) {
        const char *yr = (const char *)p[1] + j * STATE_WIDTH * H * item, *gr = (const char *)p[2] + j * STATE_WIDTH * H * item;
        const char *cp = k == 3 ? (const char *)p[4] + (j * STATE_WIDTH + 1) * H * item : NULL;
        char *dr = (char *)dpre + j * 4 * H * item, *dcr = k == 3 ? (char *)dcp + j * H * item : NULL;
        if (f32)
            step_row_f32(fn, (const float *)yr, (const float *)gr, (const float *)cp, (float *)dc, (float *)dr,
                         (float *)dcr, H);
        else
            step_row_f64(fn, (const double *)yr, (const double *)gr, (const double *)cp, (double *)dc, (double *)dr,
                         (double *)dcr, H);
    }
    out = PyTuple_New(k);
    if (!out)
        goto done;
    PyTuple_SET_ITEM(out, 0, Py_NewRef(PyTuple_GET_ITEM(need, 0) == Py_True ? dp : Py_None));
    if (k == 3) {
        PyTuple_SET_ITEM(out, 1, Py_NewRef(Py_None));  /* W_h: deferred below */
        PyTuple_SET_ITEM(out, 2, Py_NewRef(Py_None));
        if (PyTuple_GET_ITEM(need, 1) == Py_True) {
            PyObject *hp = h_rows(ctx, (const char *)p[4], B, H, item);
            int bad = !hp || dg_defer_pair(ctx, wb, dp, hp) < 0;
            Py_XDECREF(hp);
            if (bad)
                goto fail;
        }
        if (PyTuple_GET_ITEM(need, 2) == Py_True) {
            PyObject *gs = B == 1 ? one_state_grad(ctx, dpre, p[3], dcp, H, item, f32) : NULL;
            if (!gs && !PyErr_Occurred())
                gs = state_grad(ctx, dp, PyList_GET_ITEM(xs, 1), dcp, B, H, item);
            if (!gs)
                goto fail;
            Py_DECREF(PyTuple_GET_ITEM(out, 2));
            PyTuple_SET_ITEM(out, 2, gs);
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(dc);
    Py_XDECREF(dp);
    return out;
}
