/* Where an elementwise run reads and writes (part of dynagraph._bookkeeping; see bookkeeping.h).

A run (dynagraph/runs.py) is one C call over consecutive elementwise batches that reads
its arguments in place. Before the call, its tables of value and gradient addresses are
built here, every block checked for dtype, contiguity and size (the twins are in runs.py).
*/
#include "bookkeeping.h"

static PyObject *NAME_SHAPE;  /* "shape", interned (dg_attr) */

/* *addr: the data address of `a`, a writable C-contiguous buffer. 1 when it holds `format`
   elements; 0 when it holds others (no exception set: the caller words the error); -1 with an
   exception set when it is no such buffer. */
static int writable_address(PyObject *a, const char *format, int64_t *addr) {
    Py_buffer v;
    if (dg_get_buffer(a, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    int ok = v.format && !strcmp(v.format, format);
    *addr = (int64_t)(intptr_t)v.buf;
    PyBuffer_Release(&v);
    return ok;
}

/* addresses(arrays, format): bytearray of int64, the data address of each array (0 for
   None). Each must be a C-contiguous buffer of `format` ('f' or 'd') elements, else
   ValueError: the caller hands these to a kernel that writes through them. */
PyObject *dg_addresses(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyList_CheckExact(argv[0]) || !PyUnicode_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "addresses(arrays: list, format: str)");
        return NULL;
    }
    const char *format = PyUnicode_AsUTF8(argv[1]);
    if (!format)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(argv[0]);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!out)
        return NULL;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(argv[0], i);
        o[i] = 0;
        if (a == Py_None)
            continue;
        int ok = writable_address(a, format, &o[i]);
        if (ok <= 0) {
            if (ok == 0)
                PyErr_Format(PyExc_ValueError, "addresses: array %zd does not hold '%s' elements", i, format);
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* The output block of one run step of B nodes whose first is i0: empty((B,) + shape[i0], dtype),
   or NULL with an exception set. */
static PyObject *step_block(PyObject *shape, Py_ssize_t i0, Py_ssize_t B, PyObject *empty, PyObject *dtype) {
    PyObject *sh = PyList_GET_ITEM(shape, i0);
    if (!PyTuple_CheckExact(sh)) {
        PyErr_Format(PyExc_TypeError, "place_steps: shape[%zd] must be a tuple", i0);
        return NULL;
    }
    Py_ssize_t d = PyTuple_GET_SIZE(sh);
    PyObject *full = PyTuple_New(d + 1), *n = full ? PyLong_FromSsize_t(B) : NULL;
    if (!n) {
        Py_XDECREF(full);
        return NULL;
    }
    PyTuple_SET_ITEM(full, 0, n);
    for (Py_ssize_t k = 0; k < d; k++)
        PyTuple_SET_ITEM(full, k + 1, Py_NewRef(PyTuple_GET_ITEM(sh, k)));
    PyObject *a = PyObject_CallFunctionObjArgs(empty, full, dtype, NULL);
    Py_DECREF(full);
    return a;
}

/* One step of place_steps: its block made, appended to blocks (id bid) and its nodes placed in
   it; *addr its data address, checked as addresses() checks. 0, or -1 with an exception set. */
static int place_step(PyObject *const *argv, PyObject *nodes, int64_t *addr, const char *format) {
    PyObject *blk = argv[0], *row = argv[1], *shape = argv[2], *blocks = argv[4];
    if ((!PyList_CheckExact(nodes) && !PyTuple_CheckExact(nodes)) || PySequence_Fast_GET_SIZE(nodes) == 0) {
        PyErr_SetString(PyExc_TypeError, "place_steps: each step must be a non-empty list or tuple of node ids");
        return -1;
    }
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), i0 = dg_index_in(PySequence_Fast_ITEMS(nodes)[0],
                                                                      PyList_GET_SIZE(shape));
    PyObject *a = i0 < 0 ? NULL : step_block(shape, i0, B, argv[5], argv[6]);
    PyObject *bid = a ? dg_int(PyList_GET_SIZE(blocks)) : NULL;
    int ok = bid && PyList_Append(blocks, a) == 0 ? writable_address(a, format, addr) : -1;
    if (ok == 0)
        PyErr_Format(PyExc_ValueError, "place_steps: empty() made a block not of '%s' elements", format);
    PyObject *pargv[4] = {blk, row, nodes, bid}, *placed = ok > 0 ? dg_place(NULL, pargv, 4) : NULL;
    Py_XDECREF(placed);
    Py_XDECREF(bid);
    Py_XDECREF(a);
    return placed ? 0 : -1;
}

/* place_steps(blk, row, shape, steps, blocks, empty, dtype, format): a run's output blocks, one per
   step: empty((len(nodes),) + shape[nodes[0]], dtype) appended to blocks, and the step's nodes
   placed in it (executor.place). One call for the run, where the executor called numpy.empty and
   place() once per step. Returns (outs, rows): bytearrays of int64, each new block's data address
   and each step's node count. The twin is runs._place_steps_py. */
PyObject *dg_place_steps(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2])
        || !PyList_CheckExact(argv[3]) || !PyList_CheckExact(argv[4]) || !PyUnicode_Check(argv[7])) {
        PyErr_SetString(PyExc_TypeError, "place_steps(blk, row, shape, steps, blocks: lists, empty, dtype, "
                                         "format: str)");
        return NULL;
    }
    const char *format = PyUnicode_AsUTF8(argv[7]);
    PyObject *steps = argv[3];
    Py_ssize_t m = PyList_GET_SIZE(steps);
    PyObject *outs = format ? PyByteArray_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(int64_t)) : NULL;
    PyObject *rows = outs ? PyByteArray_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(int64_t)) : NULL;
    for (Py_ssize_t k = 0; rows && k < m; k++) {
        if (k >= PyList_GET_SIZE(steps)) {  /* empty() may run Python code */
            PyErr_SetString(PyExc_RuntimeError, "place_steps: steps changed during the call");
            Py_CLEAR(rows);
            break;
        }
        PyObject *nodes = Py_NewRef(PyList_GET_ITEM(steps, k));
        int bad = place_step(argv, nodes, (int64_t *)PyByteArray_AS_STRING(outs) + k, format) < 0;
        if (!bad)
            ((int64_t *)PyByteArray_AS_STRING(rows))[k] = (int64_t)PySequence_Fast_GET_SIZE(nodes);
        Py_DECREF(nodes);
        if (bad)
            Py_CLEAR(rows);
    }
    PyObject *res = rows ? PyTuple_Pack(2, outs, rows) : NULL;
    Py_XDECREF(outs);
    Py_XDECREF(rows);
    return res;
}

/* The data address of `a`, a writable C-contiguous buffer of `format` elements holding exactly
   as many bytes and rows as `value` (the value block it is the gradient of), or -1 with an
   exception set. Equal length and rows mean equal row width, so the byte offsets a run
   table computed from the value block are in range in its gradient block too. */
static int64_t grad_address(PyObject *a, PyObject *value, const char *format, Py_ssize_t i, Py_ssize_t *len) {
    Py_buffer g, v;
    if (dg_get_buffer(a, &g, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    if (dg_get_buffer(value, &v, PyBUF_ND) < 0) {
        PyBuffer_Release(&g);
        return -1;
    }
    int ok = g.format && !strcmp(g.format, format) && g.len == v.len && g.ndim >= 1 && v.ndim >= 1
             && g.shape[0] == v.shape[0];
    int64_t at = (int64_t)(intptr_t)g.buf;
    *len = g.len;
    PyBuffer_Release(&g);
    PyBuffer_Release(&v);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "grad_addresses: gradient block %zd is not a '%s' array shaped like "
                                       "its value block", i, format);
        return -1;
    }
    return at;
}

/* The format of grad_addresses(grads, values, format[, pair_slot, pair_off]), or NULL with
   an exception set when the arguments are not its. */
static const char *grad_addresses_format(PyObject *const *argv, Py_ssize_t nargs) {
    if ((nargs != 3 && nargs != 5) || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1])
        || !PyUnicode_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "grad_addresses(grads: list, values: list, format: str"
                                         "[, pair_slot, pair_off])");
        return NULL;
    }
    const char *format = PyUnicode_AsUTF8(argv[2]);
    if (!format)
        return NULL;
    if (strcmp(format, "f") && strcmp(format, "d")) {
        PyErr_SetString(PyExc_ValueError, "grad_addresses: format must be 'f' or 'd'");
        return NULL;
    }
    if (PyList_GET_SIZE(argv[1]) != PyList_GET_SIZE(argv[0])) {
        PyErr_SetString(PyExc_ValueError, "grad_addresses: one value block per gradient block");
        return NULL;
    }
    return format;
}

/* Per pair p (pair_slot, pair_off: int64 buffers of equal length): the address of byte
   pair_off[p] of gradient block pair_slot[p] (at[s], len[s] bytes; 0 where it is None).
   A new bytearray, or NULL with an exception set. */
static PyObject *pair_addresses(PyObject *pair_slot, PyObject *pair_off, const int64_t *at, const Py_ssize_t *len,
                                Py_ssize_t n) {
    Py_buffer ps, po;
    PyObject *out = NULL;
    if (dg_get_buffer(pair_slot, &ps, PyBUF_SIMPLE) < 0)
        return NULL;
    if (dg_get_buffer(pair_off, &po, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ps);
        return NULL;
    }
    if (ps.len != po.len || ps.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "grad_addresses: pair_slot and pair_off must be int64 of equal length");
    } else if ((out = PyByteArray_FromStringAndSize(NULL, ps.len))) {
        Py_ssize_t np_ = ps.len / (Py_ssize_t)sizeof(int64_t);
        const int64_t *slot = ps.buf, *off = po.buf;
        int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
        for (Py_ssize_t p = 0; p < np_; p++) {
            int64_t s = slot[p];
            if (s < 0 || s >= n || off[p] < 0 || (at[s] && off[p] >= len[s])) {
                PyErr_Format(PyExc_ValueError, "grad_addresses: pair %zd (slot %lld, byte %lld) is out of range",
                             p, (long long)s, (long long)off[p]);
                Py_CLEAR(out);
                break;
            }
            o[p] = at[s] ? at[s] + off[p] : 0;
        }
    }
    PyBuffer_Release(&ps);
    PyBuffer_Release(&po);
    return out;
}

/* grad_addresses(grads, values, format[, pair_slot, pair_off]): the twin of
   runs._grad_addresses_py. grads[i] is None or the gradient block of values[i] (checked by
   grad_address). Without pairs: bytearray of int64, each gradient block's address (0 for
   None). With pairs (int64 buffers of equal length, as run_table returns them): per pair p,
   the address of byte pair_off[p] of grads[pair_slot[p]], or 0 where that block is None
   (the row of an argument whose gradient is not needed: the kernel never writes it). */
PyObject *dg_grad_addresses(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    const char *format = grad_addresses_format(argv, nargs);
    if (!format)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(argv[0]);
    int64_t *at = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    Py_ssize_t *len = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    PyObject *out = NULL;
    if (!at || !len) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* every item is read before anything is returned: a buffer export runs no Python code
           for numpy arrays, and the list is not used again after this loop */
        PyObject *a = PyList_GET_ITEM(argv[0], i), *v = PyList_GET_ITEM(argv[1], i);
        at[i] = 0;
        len[i] = 0;
        if (a == Py_None)
            continue;
        Py_INCREF(a);
        Py_INCREF(v);
        at[i] = grad_address(a, v, format, i, &len[i]);
        Py_DECREF(a);
        Py_DECREF(v);
        if (at[i] == -1)
            goto done;
    }
    if (nargs == 3)
        out = PyByteArray_FromStringAndSize((const char *)at, n * (Py_ssize_t)sizeof(int64_t));
    else
        out = pair_addresses(argv[3], argv[4], at, len, n);
done:
    PyMem_Free(at);
    PyMem_Free(len);
    return out;
}

/* The bytes [*lo, *hi) that `avoid` spans, whatever its strides; both NULL when it is None
   or empty. 0, or -1 with an exception set. */
static int avoid_span(PyObject *avoid, const char **lo, const char **hi) {
    *lo = *hi = NULL;
    if (avoid == Py_None)
        return 0;
    Py_buffer a;
    if (dg_get_buffer(avoid, &a, PyBUF_RECORDS_RO) < 0)
        return -1;
    const char *first = a.buf, *last = a.buf;
    int empty = 0;
    for (int i = 0; i < a.ndim; i++) {
        if (a.shape[i] == 0)
            empty = 1;
        Py_ssize_t span = (a.shape[i] - 1) * (a.strides ? a.strides[i] : 0);
        if (span < 0)
            first += span;
        else
            last += span;
    }
    if (!empty) {
        *lo = first;
        *hi = last + a.itemsize;
    }
    PyBuffer_Release(&a);
    return 0;
}

/* block_table(arrays, shapes, format, writable, avoid): the row movers' table of block addresses
   (backends/cpu/rows.py, gather_indexed and scatter_indexed). Each arrays[k] must be a C-contiguous
   buffer of `format` elements ('f' or 'd') shaped exactly shapes[k] (writable if asked). Returns
   None when one is not (the caller's Python path converts it or reports it), else
   (bytearray of int64 addresses, whether any block's bytes overlap those of `avoid`, a buffer or None). */
PyObject *dg_block_table(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyList_CheckExact(argv[0]) || !PyTuple_CheckExact(argv[1]) || !PyUnicode_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "block_table(arrays: list, shapes: tuple, format: str, writable, avoid)");
        return NULL;
    }
    const char *format = PyUnicode_AsUTF8(argv[2]);
    int writable = PyObject_IsTrue(argv[3]);
    if (!format || writable < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(argv[0]);
    if (PyTuple_GET_SIZE(argv[1]) != n) {
        PyErr_SetString(PyExc_ValueError, "block_table: one shape per array");
        return NULL;
    }
    const char *lo, *hi;  /* avoid's bytes */
    if (avoid_span(argv[4], &lo, &hi) < 0)
        return NULL;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!out)
        return NULL;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    int overlaps = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *arr = PyList_GET_ITEM(argv[0], k), *shape = PyTuple_GET_ITEM(argv[1], k);
        Py_buffer v;
        if (!PyTuple_CheckExact(shape)
            || dg_get_buffer(arr, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
            PyErr_Clear();
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        int ok = v.format && !strcmp(v.format, format) && v.ndim == PyTuple_GET_SIZE(shape);
        for (int i = 0; ok && i < v.ndim; i++)
            ok = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i)) == v.shape[i];
        PyErr_Clear();
        o[k] = (int64_t)(intptr_t)v.buf;
        if (lo && (const char *)v.buf < hi && lo < (const char *)v.buf + v.len)
            overlaps = 1;
        PyBuffer_Release(&v);
        if (!ok) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
    }
    return Py_BuildValue("(NO)", out, overlaps ? Py_True : Py_False);
}

enum { ROWS_MAX = 64 };  /* the most rows row_index_small takes */

/* The n (block, row) pairs as int64 into b and r, and the sorted distinct block ids into
   ids (*nid of them). 1, or 0 when a value is not an int or a block id is out of range. */
static int small_rows(PyObject *blks, PyObject *rows, Py_ssize_t nb, int64_t *b, int64_t *r, int64_t *ids,
                      Py_ssize_t *nid) {
    *nid = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(blks); j++) {
        PyObject *bo = PyTuple_GET_ITEM(blks, j), *ro = PyTuple_GET_ITEM(rows, j);
        if (!PyLong_CheckExact(bo) || !PyLong_CheckExact(ro))
            return 0;
        b[j] = PyLong_AsLongLong(bo);
        r[j] = PyLong_AsLongLong(ro);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (b[j] < 0 || b[j] >= nb)
            return 0;
        Py_ssize_t at = 0;  /* insertion into the sorted distinct ids */
        while (at < *nid && ids[at] < b[j])
            at++;
        if (at == *nid || ids[at] != b[j]) {
            memmove(&ids[at + 1], &ids[at], (size_t)(*nid - at) * sizeof(int64_t));
            ids[at] = b[j];
            (*nid)++;
        }
    }
    return 1;
}

/* The rows of a block shaped sh (a tuple of ints) whose row shape is s0's (the first
   block's; NULL for the first block itself), or -1 when it is not. */
static Py_ssize_t rows_of_shape(PyObject *sh, PyObject *s0) {
    Py_ssize_t d = PyTuple_CheckExact(sh) ? PyTuple_GET_SIZE(sh) : 0;
    int ok = d >= 1;
    if (ok && s0) {  /* one row shape for all */
        ok = PyTuple_GET_SIZE(s0) == d;
        for (Py_ssize_t i = 1; ok && i < d; i++) {
            PyObject *x = PyTuple_GET_ITEM(sh, i), *y = PyTuple_GET_ITEM(s0, i);
            ok = PyLong_CheckExact(x) && PyLong_CheckExact(y) && PyLong_AsSsize_t(x) == PyLong_AsSsize_t(y);
        }
    }
    return ok && PyLong_CheckExact(PyTuple_GET_ITEM(sh, 0)) ? PyLong_AsSsize_t(PyTuple_GET_ITEM(sh, 0)) : -1;
}

/* Per distinct block id: its int into idt, its .shape into shapes and its rows into nrows
   (both tuples of nid, filled here). 1, 0 when some block is not one the index takes,
   -1 with an exception set. */
static int small_shapes(PyObject *blocks, const int64_t *ids, Py_ssize_t nid, PyObject *idt, PyObject *shapes,
                        Py_ssize_t *nrows) {
    for (Py_ssize_t k = 0; k < nid; k++) {
        PyObject *io = PyLong_FromLongLong(ids[k]);
        if (!io)
            return -1;
        PyTuple_SET_ITEM(idt, k, io);
        if (ids[k] >= PyList_GET_SIZE(blocks))  /* a shape getter below may have changed the list */
            return 0;
        PyObject *blk = PyList_GET_ITEM(blocks, ids[k]);
        Py_INCREF(blk);
        PyObject *sh = dg_attr(blk, &NAME_SHAPE, "shape");
        Py_DECREF(blk);
        if (!sh) {
            PyErr_Clear();
            return 0;
        }
        PyTuple_SET_ITEM(shapes, k, sh);
        nrows[k] = rows_of_shape(sh, k > 0 ? PyTuple_GET_ITEM(shapes, 0) : NULL);
        if (nrows[k] < 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* row_index_small(blocks, blks, rows): the cpu backend's row index for a few rows of Python ints
   (the executor's per-sentence gathers; backends/cpu/rows.py _row_index_small is the twin and
   reports every error). Returns None unless every value is an int, every block id is in range,
   every block's .shape is a tuple with the first one's row shape and every row is within its
   block; else (ids: sorted distinct block ids, local: int64 bytes, each row's position in ids,
   rows: int64 bytes, shapes: each id's shape). At most 64 rows. */
PyObject *dg_row_index_small(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(argv[0]) || !PyTuple_CheckExact(argv[1]) || !PyTuple_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "row_index_small(blocks: list, blks: tuple, rows: tuple)");
        return NULL;
    }
    PyObject *blocks = argv[0];
    Py_ssize_t n = PyTuple_GET_SIZE(argv[1]), nid;
    if (n == 0 || n > ROWS_MAX || PyTuple_GET_SIZE(argv[2]) != n)
        Py_RETURN_NONE;
    int64_t b[ROWS_MAX], r[ROWS_MAX], ids[ROWS_MAX], local[ROWS_MAX];
    if (!small_rows(argv[1], argv[2], PyList_GET_SIZE(blocks), b, r, ids, &nid))
        Py_RETURN_NONE;
    PyObject *shapes = PyTuple_New(nid), *idt = PyTuple_New(nid), *res = NULL;
    Py_ssize_t nrows[ROWS_MAX];
    int got = shapes && idt ? small_shapes(blocks, ids, nid, idt, shapes, nrows) : -1;
    for (Py_ssize_t j = 0; got == 1 && j < n; j++) {
        Py_ssize_t k = 0;
        while (ids[k] != b[j])
            k++;
        if (r[j] < 0 || r[j] >= nrows[k])
            got = 0;
        local[j] = k;
    }
    if (got == 1) {
        res = Py_BuildValue("(Ny#y#O)", idt, (const char *)local, n * (Py_ssize_t)sizeof(int64_t), (const char *)r,
                            n * (Py_ssize_t)sizeof(int64_t), shapes);
        idt = NULL;  /* stolen by N */
    } else if (got == 0) {
        res = Py_None;
        Py_INCREF(res);
    }
    Py_XDECREF(shapes);
    Py_XDECREF(idt);
    return res;
}
