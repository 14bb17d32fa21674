/* Py_buffer views of numpy arrays without the buffer protocol (part of dynagraph._bookkeeping;
see bookkeeping.h: dg_get_buffer).

Why: numpy's getbuffer builds, caches and compares a format string and shape/strides info per
array on every export (_buffer_get_info, _buffer_format_string: a dict keyed by the array and a
malloc). The compiled per-batch steps take several views a batch, and per sentence most batches
hold one node: array_getbuffer was ~11% of a per-sentence BiRNN epoch's instructions (callgrind).

An exact numpy.ndarray of float32 or float64 in native byte order ('='), C-contiguous with its
canonical strides, is read directly: numpy's PyArrayObject_fields and the head of PyArray_Descr
are part of its ABI (PyArray_DATA and friends are inline functions in every compiled extension)
and are the same in numpy 1.x and 2.x. The view holds a reference to the array like the
protocol's does, so PyBuffer_Release is the same call for both. The first array read this way is
also exported through the protocol and every field compared; any difference, or an ndarray type
with a releasebuffer slot, switches the direct path off for the process. Anything else (other
dtypes, strided or read-only views asked to be writable, subclasses) goes through the protocol.
*/
#include "bookkeeping.h"

#include <string.h>

typedef struct {  /* numpy's PyArrayObject_fields, the part read here */
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} NdFields;

typedef struct {  /* the head of numpy's PyArray_Descr (1.x and 2.x alike) */
    PyObject_HEAD
    PyTypeObject *typeobj;
    char kind, type, byteorder, former_flags;
    int type_num;
} DescrHead;

enum { NPY_FLOAT_NUM = 11, NPY_DOUBLE_NUM = 12, C_CONTIGUOUS_FLAG = 0x0001, WRITEABLE_FLAG = 0x0400 };
enum { MAX_DIRECT_NDIM = 8 };

static PyTypeObject *NDARRAY = NULL;  /* numpy.ndarray, once one was seen */
static int STATE = 0;                 /* 0: not yet checked, 1: checked, -1: off */

static int native_order(char b) {
    return b == '=';  /* numpy's own spelling of native order ('<' on a little-endian machine is not rewritten here) */
}

/* 1 with *v filled (a reference to o held), 0 when o does not fit the direct path. */
static int direct_view(PyObject *o, Py_buffer *v, int flags) {
    const NdFields *a = (const NdFields *)o;
    const DescrHead *d = (const DescrHead *)a->descr;
    if (a->nd < 0 || a->nd > MAX_DIRECT_NDIM || !(a->flags & C_CONTIGUOUS_FLAG) || !native_order(d->byteorder))
        return 0;
    Py_ssize_t itemsize = d->type_num == NPY_FLOAT_NUM ? 4 : d->type_num == NPY_DOUBLE_NUM ? 8 : 0;
    if (!itemsize || ((flags & PyBUF_WRITABLE) && !(a->flags & WRITEABLE_FLAG)))
        return 0;
    Py_ssize_t stride = itemsize;  /* ends as the array's length in bytes */
    for (int k = a->nd - 1; k >= 0; k--) {  /* canonical C strides only: numpy may rewrite others on export */
        if (a->strides[k] != stride)
            return 0;
        stride *= a->dimensions[k];
    }
    Py_INCREF(o);
    v->obj = o;
    v->buf = a->data;
    v->len = stride;
    v->itemsize = itemsize;
    v->readonly = !(a->flags & WRITEABLE_FLAG);
    v->ndim = a->nd;
    v->format = (flags & PyBUF_FORMAT) ? (char *)(itemsize == 4 ? "f" : "d") : NULL;
    v->shape = (flags & PyBUF_ND) == PyBUF_ND ? a->dimensions : NULL;
    v->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? a->strides : NULL;
    v->suboffsets = NULL;
    v->internal = NULL;
    return 1;
}

static int same_dims(const Py_ssize_t *x, const Py_ssize_t *y, int nd) {
    if (!x || !y)
        return x == y || nd == 0;
    return memcmp(x, y, (size_t)nd * sizeof(Py_ssize_t)) == 0;
}

/* The first direct view against the protocol's export of the same array, field by field. */
static void check_once(PyObject *o, const Py_buffer *v, int flags) {
    Py_buffer p;
    if (Py_TYPE(o)->tp_as_buffer == NULL || Py_TYPE(o)->tp_as_buffer->bf_releasebuffer != NULL
        || PyObject_GetBuffer(o, &p, flags) < 0) {
        PyErr_Clear();
        STATE = -1;
        return;
    }
    int ok = p.buf == v->buf && p.len == v->len && p.itemsize == v->itemsize && p.readonly == v->readonly
             && p.ndim == v->ndim && same_dims(p.shape, v->shape, v->ndim)
             && same_dims(p.strides, v->strides, v->ndim) && p.suboffsets == NULL
             && ((!p.format && !v->format) || (p.format && v->format && strcmp(p.format, v->format) == 0));
    PyBuffer_Release(&p);
    STATE = ok ? 1 : -1;
}

int dg_get_buffer(PyObject *o, Py_buffer *v, int flags) {
    PyTypeObject *t = Py_TYPE(o);
    if (STATE >= 0 && (t == NDARRAY || (NDARRAY == NULL && strcmp(t->tp_name, "numpy.ndarray") == 0))) {
        if (direct_view(o, v, flags)) {
            if (STATE == 1)
                return 0;
            check_once(o, v, flags);
            if (STATE == 1) {
                NDARRAY = t;
                return 0;
            }
            PyBuffer_Release(v);
        }
    }
    return PyObject_GetBuffer(o, v, flags);
}

/* o's numpy fields when they may be read directly: an exact ndarray, once the direct view has been
   checked against the protocol (STATE 1 sets NDARRAY); else NULL. */
static const NdFields *checked_fields(PyObject *o) {
    return STATE == 1 && Py_TYPE(o) == NDARRAY ? (const NdFields *)o : NULL;
}

/* An exact ndarray of native float32 or float64 read from numpy's fields (once the direct view has
   been checked against the protocol): its address, ndim, dims and strides as the object holds them
   (a size-1 axis may carry any stride), 'f' or 'd', and whether it is writable. No reference is taken and nothing needs
   releasing: valid while the caller holds o. 1, or 0 when o must go through dg_get_buffer. */
int dg_array_peek(PyObject *o, dg_array_fields *f) {
    const NdFields *a = checked_fields(o);
    if (!a)
        return 0;
    const DescrHead *d = (const DescrHead *)a->descr;
    if (a->nd < 0 || !native_order(d->byteorder) || (d->type_num != NPY_FLOAT_NUM && d->type_num != NPY_DOUBLE_NUM))
        return 0;
    f->data = a->data;
    f->nd = a->nd;
    f->shape = a->dimensions;
    f->strides = a->strides;
    f->itemsize = d->type_num == NPY_FLOAT_NUM ? 4 : 8;
    f->format = d->type_num == NPY_FLOAT_NUM ? 'f' : 'd';
    f->writable = (a->flags & WRITEABLE_FLAG) != 0;
    return 1;
}

/* o's fields as dg_array_peek gives them; where it cannot (the direct view is off, or another array
   type), from a buffer export (PyBUF_RECORDS_RO) kept in *v with *exported 1: the caller releases v
   once done with f, whose pointers are v's. format is 0 for a format that is not one character.
   1, or 0 (no error set) when o exports no buffer. */
int dg_array_read(PyObject *o, dg_array_fields *f, Py_buffer *v, int *exported) {
    *exported = 0;
    if (dg_array_peek(o, f))
        return 1;
    if (dg_get_buffer(o, v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    *exported = 1;
    f->data = v->buf;
    f->nd = v->ndim;
    f->shape = v->shape;
    f->strides = v->strides;
    f->itemsize = v->itemsize;
    f->format = v->format && v->format[0] && !v->format[1] ? v->format[0] : 0;
    f->writable = !v->readonly;
    return 1;
}

/* The ndim of o, with its dims in shape, when o is an ndarray of at most max_nd dims; else -1.
   Read from numpy's fields once the direct view has been checked against the protocol (any
   layout: a shape needs no contiguity), else through a buffer export. */
int dg_array_dims(PyObject *o, int max_nd, Py_ssize_t *shape) {
    const NdFields *a = checked_fields(o);
    if (a) {
        if (a->nd < 0 || a->nd > max_nd)
            return -1;
        for (int k = 0; k < a->nd; k++)
            shape[k] = a->dimensions[k];
        return a->nd;
    }
    Py_buffer v;
    if (dg_get_buffer(o, &v, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return -1;
    }
    int nd = v.ndim <= max_nd ? v.ndim : -1;
    for (int i = 0; i < nd; i++)
        shape[i] = v.shape[i];
    PyBuffer_Release(&v);
    return nd;
}

PyObject *dg_array_view_state(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    (void)argv;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "array_view_state() takes no arguments");
        return NULL;
    }
    return PyLong_FromLong(STATE);
}
