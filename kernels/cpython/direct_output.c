/* The outputs of the compiled batch step's direct kernels (part of dynagraph._bookkeeping):
made by numpy.empty, and marked ready when already the batch's block. Shared by direct_batch.c
and direct_products.c. */
#include "bookkeeping.h"

/* *ctx->ready: whether the output w (of dtype t) is already the batch's block, as batch_run.c's
   ready() would find (the graph's dtype, shape (B,) + the node's shape), so that it need not
   export the output's buffer again to ask. */
void dg_direct_mark_ready(const dg_direct_ctx *ctx, const Py_buffer *w, int t) {
    PyObject *shape = ctx->shape;
    int ok = t == ctx->want_t && PyTuple_CheckExact(shape) && w->ndim == PyTuple_GET_SIZE(shape) + 1
             && w->shape[0] == ctx->rows;
    for (int d = 0; ok && d < w->ndim - 1; d++)
        ok = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d)) == w->shape[d + 1];
    PyErr_Clear();
    *ctx->ready = ok;
}

/* numpy.empty(shape, dtype t) (0 float32, 1 float64): a kernel's output. numpy.empty is C;
   numpy.empty_like goes through a Python dispatcher first (~0.5 us, as much as a small kernel). */
PyObject *dg_direct_empty_of(const dg_direct_ctx *ctx, PyObject *shape, int t) {
    PyObject *argv[2] = {shape, ctx->dtypes[t]};
    return PyObject_Vectorcall(ctx->empty, argv, 2, NULL);
}

/* numpy.empty((rows, cols), dtype t) with its writable buffer in *w (released by the caller), the
   size checked: a kernel writes rows * cols elements through it. NULL with an error set on failure. */
PyObject *dg_direct_new_rows(const dg_direct_ctx *ctx, Py_ssize_t rows, Py_ssize_t cols, int t, Py_buffer *w) {
    PyObject *shape = dg_tuple_nn(rows, cols);
    PyObject *out = shape ? dg_direct_empty_of(ctx, shape, t) : NULL;
    Py_XDECREF(shape);
    if (!out || dg_get_buffer(out, w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    if (w->len != rows * cols * (t ? 8 : 4)) {
        PyErr_SetString(PyExc_RuntimeError, "run_batch_native: empty made an array of another size");
        PyBuffer_Release(w);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* numpy.empty((B,) + shape (the node's), dtype t) with its writable buffer in *w (released by the
   caller), its size checked to be `bytes`. NULL with an error set on failure. */
PyObject *dg_direct_new_batch(const dg_direct_ctx *ctx, PyObject *shape, Py_ssize_t B, int t, Py_ssize_t bytes,
                              Py_buffer *w) {
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    PyObject *full = PyTuple_New(nd + 1), *b = PyLong_FromSsize_t(B);
    if (!full || !b) {
        Py_XDECREF(full);
        Py_XDECREF(b);
        return NULL;
    }
    PyTuple_SET_ITEM(full, 0, b);
    for (Py_ssize_t d = 0; d < nd; d++)
        PyTuple_SET_ITEM(full, d + 1, Py_NewRef(PyTuple_GET_ITEM(shape, d)));
    PyObject *made = dg_direct_empty_of(ctx, full, t);
    Py_DECREF(full);
    if (!made || dg_get_buffer(made, w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_XDECREF(made);
        return NULL;
    }
    if (w->len != bytes) {
        PyErr_SetString(PyExc_RuntimeError, "run_batch_native: empty made an array of another size");
        PyBuffer_Release(w);
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
