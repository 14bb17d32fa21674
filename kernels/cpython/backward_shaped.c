/* The backward of concatenate and of direct_shaped.c's ops, run by the backward step itself (part of
dynagraph._bookkeeping; backward_ops.c dispatches here and documents the contract: a tuple of
gradients, or NULL without an exception for operands that are not a case of ours, when the
op's own backward or the backend's override runs, or NULL with one on error).

    NB_CONCAT  ops/shape.py Concatenate.backward along the first per-node axis: each needed argument's
               part of g's rows (copied here; the op hands views of the same values)
    NB_RESHAPE, NB_TRANSPOSE  ops/shape.py Reshape.backward, ops/linalg.py Transpose.backward where
               the values keep their order (direct_shaped.c's test): g.reshape(x.shape), the view
               both of those return
    NB_SOFTMAX backends/cpu/overrides.py _softmax_backward: dg_softmax_bwd through its address, for
               (B, n) and (B, n, 1, ...) operands
    NB_COLWISE backends/cpu/overrides.py _colwise_add_backward: dx = g, db = the rows of g summed
               by dg_row_sums through its address
    NB_MATMUL of per-node matrices: backends/cpu/direct.py small_matmul_grads (PRODUCT_BACKWARD's first
               case), dg_small_matmul_grads through its address
*/
#include "backward_batch.h"

#include <stdint.h>
#include <string.h>

typedef void (*softmax_bwd_f32)(float *, const float *, const float *, int64_t, int64_t);
typedef void (*softmax_bwd_f64)(double *, const double *, const double *, int64_t, int64_t);
typedef void (*row_sums_f32)(float *, const float *, int64_t, int64_t, int64_t);
typedef void (*row_sums_f64)(double *, const double *, int64_t, int64_t, int64_t);
typedef void (*matmul_grads_f32)(float *, float *, const float *, int64_t, const float *, int64_t, const float *,
                                 int64_t, int64_t, int64_t, int64_t);
typedef void (*matmul_grads_f64)(double *, double *, const double *, int64_t, const double *, int64_t,
                                 const double *, int64_t, int64_t, int64_t, int64_t);

enum { SLOT_SOFTMAX = 12, SLOT_ROW_SUMS = 14, SLOT_MATMUL = 16 };  /* backends/cpu/backward.py _KERNELS */

static PyObject *NAME_RESHAPE, *NAME_SHAPE;

static int is_f32(PyObject *ctx) {
    return *PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT)) == 'f';
}

static PyObject *one(PyObject *gx) {
    if (!gx)
        return NULL;
    PyObject *r = PyTuple_Pack(1, gx);
    Py_DECREF(gx);
    return r;
}

/* NB_RESHAPE, NB_TRANSPOSE: g.reshape(x.shape) where x and g have the same rows and per-node shapes
   equal up to axes of 1 (for transpose: a permutation that moves axes of 1 only). */
static PyObject *copy_grad(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t xsh[DG_NB_MAX_ND], gsh[DG_NB_MAX_ND];
    if (PyList_GET_SIZE(xs) != 1 || PyTuple_GET_SIZE(need) != 1 || PyTuple_GET_ITEM(need, 0) != Py_True)
        return NULL;
    PyObject *x = PyList_GET_ITEM(xs, 0);
    int xn = dg_array_shape(ctx, x, DG_NB_MAX_ND, xsh), gn = dg_array_shape(ctx, g, DG_NB_MAX_ND, gsh);
    if (xn < 1 || gn < 1 || xsh[0] != gsh[0] || !dg_same_squeezed(xsh + 1, xn - 1, gsh + 1, gn - 1)
        || (code == NB_TRANSPOSE && !dg_order_kept(attrs, xsh + 1, xn - 1))) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *shape = dg_attr(x, &NAME_SHAPE, "shape");
    if (!shape)
        return NULL;
    PyObject *method = dg_attr(g, &NAME_RESHAPE, "reshape");
    PyObject *gx = method ? PyObject_CallOneArg(method, shape) : NULL;
    Py_XDECREF(method);
    Py_DECREF(shape);
    return one(gx);
}

/* NB_SOFTMAX (attrs (0,)): y and g of one shape (B, n) or (B, n, 1, ...), contiguous. */
static PyObject *softmax_grad(PyObject *ctx, PyObject *attrs, PyObject *y, PyObject *g, PyObject *need) {
    Py_ssize_t ys[DG_NB_MAX_ND], gs[DG_NB_MAX_ND];
    void *yp, *gp, *op;
    if (PyTuple_GET_SIZE(need) != 1 || PyTuple_GET_ITEM(need, 0) != Py_True || !PyTuple_CheckExact(attrs)
        || PyTuple_GET_SIZE(attrs) != 1 || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0))
        || PyLong_AsLong(PyTuple_GET_ITEM(attrs, 0)) != 0)
        return NULL;
    int nd = dg_nb_array(ctx, y, ys, 1, &yp);
    if (nd < 2 || dg_nb_array(ctx, g, gs, 1, &gp) != nd)
        return NULL;
    for (int d = 0; d < nd; d++)
        if (ys[d] != gs[d] || (d >= 2 && ys[d] != 1))
            return NULL;
    uintptr_t fn = dg_nb_kernel_address(ctx, SLOT_SOFTMAX + !is_f32(ctx));
    if (!fn || ys[1] < 1)
        return NULL;
    PyObject *gx = dg_nb_new_shaped(ctx, ys, nd, &op);
    if (!gx)
        return NULL;
    if (is_f32(ctx))
        ((softmax_bwd_f32)fn)(op, yp, gp, (int64_t)ys[0], (int64_t)ys[1]);
    else
        ((softmax_bwd_f64)fn)(op, yp, gp, (int64_t)ys[0], (int64_t)ys[1]);
    return one(gx);
}

/* NB_COLWISE: x (B, r, c) of g's shape, b (B, r) or (B, r, 1); g contiguous. */
static PyObject *colwise_grad(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t gs[DG_NB_MAX_ND], xsh[DG_NB_MAX_ND], bs[DG_NB_MAX_ND];
    void *gp, *op;
    if (PyList_GET_SIZE(xs) != 2 || PyTuple_GET_SIZE(need) != 2 || dg_nb_array(ctx, g, gs, 1, &gp) != 3)
        return NULL;
    int xn = dg_array_shape(ctx, PyList_GET_ITEM(xs, 0), DG_NB_MAX_ND, xsh),
        bn = dg_array_shape(ctx, PyList_GET_ITEM(xs, 1), DG_NB_MAX_ND, bs);
    if (xn != 3 || xsh[0] != gs[0] || xsh[1] != gs[1] || xsh[2] != gs[2] || (bn != 2 && bn != 3) || bs[0] != gs[0]
        || bs[1] != gs[1] || (bn == 3 && bs[2] != 1)) {
        PyErr_Clear();
        return NULL;
    }
    uintptr_t fn = dg_nb_kernel_address(ctx, SLOT_ROW_SUMS + !is_f32(ctx));
    if (!fn)
        return NULL;
    PyObject *gx = PyTuple_GET_ITEM(need, 0) == Py_True ? Py_NewRef(g) : Py_NewRef(Py_None), *gb;
    if (PyTuple_GET_ITEM(need, 1) != Py_True) {
        gb = Py_NewRef(Py_None);
    } else if ((gb = dg_nb_new_shaped(ctx, bs, bn, &op)) != NULL) {
        if (is_f32(ctx))
            ((row_sums_f32)fn)(op, gp, (int64_t)(gs[0] * gs[1]), (int64_t)gs[2], 1);
        else
            ((row_sums_f64)fn)(op, gp, (int64_t)(gs[0] * gs[1]), (int64_t)gs[2], 1);
    } else {
        Py_DECREF(gx);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, gx, gb);
    Py_DECREF(gx);
    Py_DECREF(gb);
    return r;
}

/* NB_MATMUL of matrices: A (1 or B, r, k), X (1 or B, k, c) with at most NB_PRODUCT_MACS_MAX
   multiply-adds, g (B, r, c), all contiguous; a needed gradient's operand has B rows. NULL with
   no exception for anything else (vectors: dg_nb_products). */
PyObject *dg_nb_matrix_products(PyObject *ctx, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t as[DG_NB_MAX_ND], xsh[DG_NB_MAX_ND], gs[DG_NB_MAX_ND];
    void *ap, *xp, *gp, *gA = NULL, *gX = NULL;
    /* X first: a product with a vector (the common W x, dg_nb_products' case) is turned away
       after one read */
    if (PyList_GET_SIZE(xs) != 2 || PyTuple_GET_SIZE(need) != 2 || dg_nb_array(ctx, PyList_GET_ITEM(xs, 1), xsh, 1, &xp) != 3
        || dg_nb_array(ctx, PyList_GET_ITEM(xs, 0), as, 1, &ap) != 3 || dg_nb_array(ctx, g, gs, 1, &gp) != 3)
        return NULL;
    Py_ssize_t B = gs[0], r = as[1], k = as[2], c = xsh[2];
    int need_a = PyTuple_GET_ITEM(need, 0) == Py_True, need_x = PyTuple_GET_ITEM(need, 1) == Py_True;
    if (xsh[1] != k || gs[1] != r || gs[2] != c || (as[0] != 1 && as[0] != B) || (xsh[0] != 1 && xsh[0] != B)
        || (as[0] < B && xsh[0] < B) || (need_a && as[0] != B) || (need_x && xsh[0] != B) || r < 1 || k < 1 || c < 1
        || B * r * k * c > NB_PRODUCT_MACS_MAX)
        return NULL;
    uintptr_t fn = dg_nb_kernel_address(ctx, SLOT_MATMUL + !is_f32(ctx));
    if (!fn)
        return NULL;
    PyObject *ga = need_a ? dg_nb_new_shaped(ctx, as, 3, &gA) : Py_NewRef(Py_None);
    PyObject *gx = ga && need_x ? dg_nb_new_shaped(ctx, xsh, 3, &gX) : ga ? Py_NewRef(Py_None) : NULL;
    if (!ga || !gx) {
        Py_XDECREF(ga);
        return NULL;
    }
    int64_t a_s = as[0] == 1 ? 0 : r * k, x_s = xsh[0] == 1 ? 0 : k * c;
    if (is_f32(ctx))
        ((matmul_grads_f32)fn)(gA, gX, ap, a_s, xp, x_s, gp, (int64_t)B, (int64_t)r, (int64_t)k, (int64_t)c);
    else
        ((matmul_grads_f64)fn)(gA, gX, ap, a_s, xp, x_s, gp, (int64_t)B, (int64_t)r, (int64_t)k, (int64_t)c);
    PyObject *res = PyTuple_Pack(2, ga, gx);
    Py_DECREF(ga);
    Py_DECREF(gx);
    return res;
}

/* NB_CONCAT: Concatenate.backward along the first per-node axis (attrs (0,)) where g is a contiguous
   (B, W, ...) array of the graph's dtype and every argument (B, w_k, ...) with the w_k adding up
   to W and g's trailing axes (an argument with fewer axes counts the missing ones as 1: attention's
   (2H, 1) context beside an (H,) vector): the argument's part of each row of g, into a new array of
   its shape. Anything else (shared or broadcast arguments, in-place operands, more than CONCAT_MAX
   arguments) returns NULL with no exception: the op's own backward runs. */
#define CONCAT_MAX 16
static PyObject *concat(PyObject *ctx, PyObject *attrs, PyObject *xs, PyObject *g, PyObject *need) {
    Py_ssize_t k = PyList_GET_SIZE(xs), gs[DG_NB_MAX_ND], s[CONCAT_MAX][DG_NB_MAX_ND], total = 0, tail = 1;
    int nds[CONCAT_MAX];
    void *gbuf;
    if (k > CONCAT_MAX || !PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) < 1 || !PyLong_CheckExact(PyTuple_GET_ITEM(attrs, 0))
        || PyLong_AsLong(PyTuple_GET_ITEM(attrs, 0)) != 0 || PyTuple_GET_SIZE(need) != k) {
        PyErr_Clear();
        return NULL;
    }
    int gn = dg_nb_array(ctx, g, gs, 1, &gbuf);
    if (gn < 2)
        return NULL;
    for (int d = 2; d < gn; d++)
        tail *= gs[d];
    for (Py_ssize_t i = 0; i < k; i++) {
        int nd = nds[i] = dg_nb_array(ctx, PyList_GET_ITEM(xs, i), s[i], 0, NULL);
        if (nd < 2 || nd > gn || s[i][0] != gs[0])
            return NULL;
        for (int d = 2; d < gn; d++)
            if ((d < nd ? s[i][d] : 1) != gs[d])
                return NULL;
        total += s[i][1];
    }
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    if (!fmt || total != gs[1]) {
        PyErr_Clear();
        return NULL;
    }
    Py_ssize_t item = !strcmp(fmt, "f") ? 4 : 8, B = gs[0], row = gs[1] * tail * item, off = 0;
    PyObject *out = PyTuple_New(k);
    for (Py_ssize_t i = 0; out && i < k; i++) {
        Py_ssize_t part = s[i][1] * tail * item;
        PyObject *gi;
        void *dst;
        if (PyTuple_GET_ITEM(need, i) != Py_True) {
            gi = Py_NewRef(Py_None);
        } else if ((gi = dg_nb_new_shaped(ctx, s[i], nds[i], &dst)) != NULL) {
            for (Py_ssize_t r = 0; r < B; r++)
                memcpy((char *)dst + r * part, (const char *)gbuf + r * row + off, (size_t)part);
        } else {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, gi);
        off += part;
    }
    return out;
}

PyObject *dg_nb_shaped(PyObject *ctx, long code, PyObject *attrs, PyObject *xs, PyObject *y, PyObject *g,
                       PyObject *need) {
    switch (code) {
    case NB_CONCAT:
        return concat(ctx, attrs, xs, g, need);
    case NB_RESHAPE:
    case NB_TRANSPOSE:
        return copy_grad(ctx, code, attrs, xs, g, need);
    case NB_SOFTMAX:
        return PyList_GET_SIZE(xs) == 1 ? softmax_grad(ctx, attrs, y, g, need) : NULL;
    case NB_COLWISE:
        return colwise_grad(ctx, xs, g, need);
    default:
        return NULL;
    }
}
