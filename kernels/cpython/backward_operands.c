/* The compiled backward step's operand checks and outputs (part of dynagraph._bookkeeping; see
backward_batch.h), shared by backward_ops.c and backward_products.c. */
#include "backward_batch.h"

#include <stdint.h>
#include <string.h>

/* An exact ndarray of the graph's dtype with ndim axes (ndim < 0: any number up to DG_NB_MAX_ND)
   whose shape goes into shape: its number of axes, else -1 with no error set. With contiguous, also
   C-contiguous (its address into *buf). One read of numpy's fields. */
static int operand(PyObject *ctx, PyObject *a, int ndim, Py_ssize_t *shape, int contiguous, void **buf) {
    if (Py_TYPE(a) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, B_NDARRAY))
        return -1;
    const char *want = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ctx, B_FORMAT));
    dg_array_fields f;
    Py_buffer v;
    int exported;
    if (!want) {
        PyErr_Clear();
        return -1;
    }
    if (!dg_array_read(a, &f, &v, &exported))  /* numpy's fields where it can (no export: ~100 instructions a read) */
        return -1;
    int nd = f.nd;
    int ok = f.format == want[0] && want[1] == 0 && (ndim < 0 ? nd >= 1 && nd <= DG_NB_MAX_ND : nd == ndim);
    Py_ssize_t step = f.itemsize;
    for (int i = nd - 1; ok && i >= 0; i--) {
        shape[i] = f.shape[i];
        if (contiguous && f.shape[i] > 1 && f.strides[i] != step)
            ok = 0;
        step *= f.shape[i];
    }
    if (ok && buf)
        *buf = f.data;  /* the array stays alive: the caller holds it */
    if (exported)
        PyBuffer_Release(&v);
    return ok ? nd : -1;
}

int dg_nb_operand(PyObject *ctx, PyObject *a, int ndim, Py_ssize_t *shape, int contiguous, void **buf) {
    return operand(ctx, a, ndim, shape, contiguous, buf) >= 0;
}

/* As dg_nb_operand with any number of axes up to DG_NB_MAX_ND (shape holds that many): the
   number of axes, or -1. */
int dg_nb_array(PyObject *ctx, PyObject *a, Py_ssize_t *shape, int contiguous, void **buf) {
    return operand(ctx, a, -1, shape, contiguous, buf);
}

/* A new (rows, cols) array of the graph's dtype (np.empty), or NULL with an exception set. */
PyObject *dg_nb_new_block(PyObject *ctx, Py_ssize_t rows, Py_ssize_t cols, void **buf) {
    Py_ssize_t shape[2] = {rows, cols};
    return dg_nb_new_shaped(ctx, shape, 2, buf);
}

/* The kernel address of slot i of the context's table (0: none). */
uintptr_t dg_nb_kernel_address(PyObject *ctx, int i) {
    PyObject *t = PyTuple_GET_ITEM(ctx, B_KERNELS);
    if (!PyBytes_CheckExact(t) || PyBytes_GET_SIZE(t) < (Py_ssize_t)((i + 1) * sizeof(uint64_t)))
        return 0;
    uint64_t a;
    memcpy(&a, PyBytes_AS_STRING(t) + i * sizeof(uint64_t), sizeof a);
    return (uintptr_t)a;
}

static PyObject *NAME_SHAPE;  /* "shape", interned (dg_attr) */

/* reduce_to(g, x.shape) (ops.base), a new reference or NULL with an exception set. Its first
   case in C: g itself when both are exact ndarrays of one shape (an affine's bias gradient per
   sentence: the Python call was ~2,900 instructions a product batch). */
PyObject *dg_nb_reduced(PyObject *ctx, PyObject *g, PyObject *x) {
    Py_ssize_t gs[4], xs[4];
    int gn = dg_array_shape(ctx, g, 4, gs);
    if (gn >= 0 && gn == dg_array_shape(ctx, x, 4, xs)) {
        int same = 1;
        for (int d = 0; d < gn && same; d++)
            same = gs[d] == xs[d];
        if (same) {
            Py_INCREF(g);
            return g;
        }
    }
    PyObject *shape = dg_attr(x, &NAME_SHAPE, "shape");
    if (!shape)
        return NULL;
    PyObject *argv[2] = {g, shape};
    PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_REDUCE_TO), argv, 2, NULL);
    Py_DECREF(shape);
    return r;
}

/* A new array of the graph's dtype and shape (shape, nd axes) (np.empty), its address in *buf, or
   NULL with an exception set. */
PyObject *dg_nb_new_shaped(PyObject *ctx, const Py_ssize_t *shape, int nd, void **buf) {
    PyObject *t = PyTuple_New(nd);
    for (int d = 0; t && d < nd; d++) {
        PyObject *e = PyLong_FromSsize_t(shape[d]);
        if (!e)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, d, e);
    }
    if (!t)
        return NULL;
    PyObject *argv[2] = {t, PyTuple_GET_ITEM(ctx, B_DTYPE)};
    PyObject *a = PyObject_Vectorcall(PyTuple_GET_ITEM(ctx, B_EMPTY), argv, 2, NULL);
    Py_DECREF(t);
    Py_ssize_t s[DG_NB_MAX_ND];
    if (a && dg_nb_array(ctx, a, s, 1, buf) != nd) {
        Py_DECREF(a);
        PyErr_SetString(PyExc_TypeError, "backward_batch_native: empty() made an unexpected array");
        return NULL;
    }
    return a;
}
