/* An argument column's gather in C (part of dynagraph._bookkeeping; used by batch_columns.c).

executor.gather is the reference for the two cases done here, a column whose rows are
  TAKE (2, b, rows)     other rows of one block: a copy of those rows, plan (TAKE, b, rows)
  MANY (3, blks, rows)  rows of several blocks: a copy of those rows and the backend's checked
                        row index, plan (MANY, index, None), which the backward scatters through
Why: per sentence a concatenation of a BiLSTM's two directions, and per mini-batch a tree's
children, read rows of a dozen blocks; in Python the row index, the gather and their checks
cost 20-40 us a column, the copy itself well under one.

Only for a backend whose direct kernels give their `row_index_maker` (the capability: without it
every column goes to Python). What is taken: every block an exact numpy array, C-contiguous, of the graph's dtype, all with
one row shape, every row in range. Anything else returns 0, having made nothing, and the
column goes to the Python gather, which converts or raises. The row index is the backend's own
type (backends/cpu/rows.py RowIndex), holding the ids, positions and rows found and checked here
as row_index does, so the backward's scatter is the one it always was. */
#include <stdlib.h>
#include <string.h>

#include "bookkeeping.h"
#include "typewise.h"  /* dg_sort_ids */

enum { TAKE_KIND = 2, MANY_KIND = 3 };

/* o as an int64 when it is an exact int that fits; 0 otherwise (no error left set). */
static int exact_int64(PyObject *o, int64_t *v) {
    if (!PyLong_CheckExact(o))
        return 0;
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *v = (int64_t)x;
    return 1;
}

/* The block's buffer when it is an exact ndarray, C-contiguous, of the graph's format, with at
   least one axis: 1, else 0 (no error left set). Released by the caller. */
static int block_buffer(const dg_gather_ctx *g, PyObject *block, Py_buffer *v) {
    if (Py_TYPE(block) != g->ndarray || dg_get_buffer(block, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (!v->format || strcmp(v->format, g->format) || v->ndim < 1) {
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

/* The buffer's shape as a tuple (the block's .shape), with its first axis replaced by n when
   n >= 0 (the gathered copy's). NULL with an error set on failure. */
static PyObject *shape_of(const Py_buffer *v, Py_ssize_t n) {
    PyObject *t = PyTuple_New(v->ndim);
    for (int d = 0; t && d < v->ndim; d++) {
        PyObject *e = PyLong_FromSsize_t(d == 0 && n >= 0 ? n : v->shape[d]);
        if (!e) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, d, e);
    }
    return t;
}

/* numpy.empty((n,) + row shape of v, the graph's dtype) and its writable buffer; NULL on error. */
static PyObject *new_rows(const dg_gather_ctx *g, const Py_buffer *v, Py_ssize_t n, Py_buffer *w) {
    PyObject *shape = shape_of(v, n);
    if (!shape)
        return NULL;
    PyObject *argv[2] = {shape, g->dtype};
    PyObject *out = PyObject_Vectorcall(g->empty, argv, 2, NULL);
    Py_DECREF(shape);
    if (out && dg_get_buffer(out, w, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        Py_CLEAR(out);
    return out;
}

static void count(const dg_gather_ctx *g, Py_ssize_t bytes) {
    g->acc[0] += 1;
    g->acc[1] += (double)bytes;
}

/* TAKE: rows `rows` of block b. 1 made, 0 not taken, -1 error. */
static int take(const dg_gather_ctx *g, PyObject *b, PyObject *rows, PyObject **x, PyObject **plan) {
    int64_t bi;
    if (!exact_int64(b, &bi) || bi < 0 || bi >= PyList_GET_SIZE(g->blocks) || !PyTuple_CheckExact(rows))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    PyObject *block = PyList_GET_ITEM(g->blocks, bi);
    Py_INCREF(block);
    Py_buffer v, w;
    int rc = 0;
    if (!block_buffer(g, block, &v))
        goto done;
    Py_ssize_t width = v.len / (v.shape[0] ? v.shape[0] : 1);  /* bytes per row */
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t r;
        if (!exact_int64(PyTuple_GET_ITEM(rows, j), &r) || r < 0 || r >= v.shape[0])
            goto release;  /* the Python path raises its IndexError */
    }
    PyObject *out = new_rows(g, &v, n, &w);
    if (!out) {
        rc = -1;
        goto release;
    }
    for (Py_ssize_t j = 0; j < n; j++)
        memcpy((char *)w.buf + j * width, (const char *)v.buf + PyLong_AsSsize_t(PyTuple_GET_ITEM(rows, j)) * width,
               (size_t)width);
    PyBuffer_Release(&w);
    *plan = dg_tuple_kab(TAKE_KIND, b, rows);
    if (!*plan) {
        Py_DECREF(out);
        rc = -1;
        goto release;
    }
    *x = out;
    count(g, n * width);
    rc = 1;
release:
    PyBuffer_Release(&v);
done:
    Py_DECREF(block);
    return rc;
}

/* The distinct block ids of b[0..n) sorted into ids (*nid of them) and each row's position among
   them into local: row_index's ids and local. */
static void distinct_ids(const int64_t *b, Py_ssize_t n, int64_t *ids, Py_ssize_t *nid, int64_t *local) {
    memcpy(ids, b, (size_t)n * sizeof(int64_t));
    /* a radix sort (sort_ids.c): qsort's comparison calls were 4% of a BiLSTM mini-batch's
       forward instructions, sorting the block ids of its 1,500-row gathers */
    _Static_assert(sizeof(int64_t) == sizeof(Py_ssize_t), "block ids sort as Py_ssize_t");
    dg_sort_ids((Py_ssize_t *)ids, n);
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (m == 0 || ids[m - 1] != ids[j])
            ids[m++] = ids[j];
    *nid = m;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t lo = 0, hi = m - 1;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (ids[mid] < b[j])
                lo = mid + 1;
            else
                hi = mid;
        }
        local[j] = lo;
    }
}

/* An int64 array over a private copy of a[0..n) in bytes: numpy.frombuffer(bytes, int64), which no
   one can make writeable again (the row index's arrays, rows.py _frozen). */
static PyObject *frozen_int64(const dg_gather_ctx *g, const int64_t *a, Py_ssize_t n) {
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)a, n * (Py_ssize_t)sizeof(int64_t));
    if (!bytes)
        return NULL;
    PyObject *argv[2] = {bytes, PyTuple_GET_ITEM(g->index_of, 2)};
    PyObject *arr = PyObject_Vectorcall(PyTuple_GET_ITEM(g->index_of, 1), argv, 2, NULL);
    Py_DECREF(bytes);
    return arr;
}

/* The backend's row index (index_of = (its type, numpy.frombuffer, int64)), made as rows.py's
   _row_index_frozen makes it: object.__new__ and object.__setattr__ of its four slots, which the
   type's own __new__ and __setattr__ refuse to Python code. */
static PyObject *row_index(const dg_gather_ctx *g, const int64_t *ids, Py_ssize_t nid, const int64_t *local,
                           const int64_t *r, Py_ssize_t n, const Py_buffer *v) {
    PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(g->index_of, 0);
    PyObject *vals[4] = {PyTuple_New(nid), frozen_int64(g, local, n), frozen_int64(g, r, n), PyTuple_New(nid)};
    static const char *names[4] = {"ids", "local", "rows", "shapes"};
    static PyObject *interned[4];  /* the slot names, made once (a new string per gather cost as much as the copy) */
    PyObject *ix = NULL;
    for (int k = 0; k < 4; k++)
        if (!interned[k] && !(interned[k] = PyUnicode_InternFromString(names[k])))
            goto done;
    if (!vals[0] || !vals[1] || !vals[2] || !vals[3])
        goto done;
    for (Py_ssize_t k = 0; k < nid; k++) {
        PyObject *i = dg_int((Py_ssize_t)ids[k]), *s = shape_of(&v[k], -1);
        if (!i || !s) {
            Py_XDECREF(i);
            Py_XDECREF(s);
            goto done;
        }
        PyTuple_SET_ITEM(vals[0], k, i);
        PyTuple_SET_ITEM(vals[3], k, s);
    }
    if (!(ix = type->tp_alloc(type, 0)))
        goto done;
    for (int k = 0; k < 4; k++)
        if (PyObject_GenericSetAttr(ix, interned[k], vals[k]) < 0) {
            Py_CLEAR(ix);
            break;
        }
done:
    for (int k = 0; k < 4; k++)
        Py_XDECREF(vals[k]);
    return ix;
}

/* The copy and the index once every block's buffer v[k] of ids[k] is held and checked. */
static int many_copy(const dg_gather_ctx *g, const int64_t *ids, Py_ssize_t nid, const int64_t *local,
                     const int64_t *r, Py_ssize_t n, const Py_buffer *v, PyObject **x, PyObject **plan) {
    Py_ssize_t width = v[0].len / (v[0].shape[0] ? v[0].shape[0] : 1);
    Py_buffer w;
    PyObject *out = new_rows(g, &v[0], n, &w);
    if (!out)
        return -1;
    for (Py_ssize_t j = 0; j < n; j++)
        memcpy((char *)w.buf + j * width, (const char *)v[local[j]].buf + r[j] * width, (size_t)width);
    PyBuffer_Release(&w);
    PyObject *index = row_index(g, ids, nid, local, r, n, v);
    *plan = index ? dg_tuple_kab(MANY_KIND, index, Py_None) : NULL;
    Py_XDECREF(index);
    if (!*plan) {
        Py_DECREF(out);
        return -1;
    }
    *x = out;
    count(g, n * width);
    return 1;
}

/* MANY: row rows[j] of block blks[j] for every j. 1 made, 0 not taken, -1 error. */
static int many(const dg_gather_ctx *g, PyObject *blks, PyObject *rows, PyObject **x, PyObject **plan) {
    if (!PyTuple_CheckExact(blks) || !PyTuple_CheckExact(rows)
        || PyTuple_GET_SIZE(blks) != PyTuple_GET_SIZE(rows) || PyTuple_GET_SIZE(blks) == 0)
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(blks), nblocks = PyList_GET_SIZE(g->blocks), nid = 0, held = 0;
    int64_t *mem = PyMem_Malloc((size_t)n * 4 * sizeof(int64_t));
    Py_buffer *v = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    PyObject **owners = PyMem_Calloc((size_t)n, sizeof(PyObject *));
    int rc = 0;
    if (!mem || !v || !owners) {
        PyErr_NoMemory();
        rc = -1;
        goto done;
    }
    int64_t *b = mem, *r = mem + n, *ids = mem + 2 * n, *local = mem + 3 * n;
    for (Py_ssize_t j = 0; j < n; j++)
        if (!exact_int64(PyTuple_GET_ITEM(blks, j), &b[j]) || !exact_int64(PyTuple_GET_ITEM(rows, j), &r[j])
            || b[j] < 0 || b[j] >= nblocks)
            goto done;
    distinct_ids(b, n, ids, &nid, local);
    for (; held < nid; held++) {  /* each block held while its buffer is read */
        owners[held] = PyList_GET_ITEM(g->blocks, ids[held]);
        Py_INCREF(owners[held]);
        if (!block_buffer(g, owners[held], &v[held])) {
            Py_DECREF(owners[held]);
            goto done;
        }
        int same = v[held].ndim == v[0].ndim;  /* one row shape: row_index's check */
        for (int d = 1; same && d < v[0].ndim; d++)
            same = v[held].shape[d] == v[0].shape[d];
        if (!same) {
            PyBuffer_Release(&v[held]);
            Py_DECREF(owners[held]);
            goto done;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++)
        if (r[j] < 0 || r[j] >= v[local[j]].shape[0])
            goto done;
    rc = many_copy(g, ids, nid, local, r, n, v, x, plan);
done:
    for (Py_ssize_t k = 0; k < held; k++) {
        PyBuffer_Release(&v[k]);
        Py_DECREF(owners[k]);
    }
    PyMem_Free(owners);
    PyMem_Free(v);
    PyMem_Free(mem);
    return rc;
}

int dg_gather_column(const dg_gather_ctx *g, PyObject *loc, PyObject **x, PyObject **plan) {
    if (g->index_of == Py_None || !PyTuple_CheckExact(loc) || PyTuple_GET_SIZE(loc) != 3)
        return 0;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(loc, 0));
    if (kind == -1 && PyErr_Occurred())
        return -1;
    if (kind == TAKE_KIND)
        return take(g, PyTuple_GET_ITEM(loc, 1), PyTuple_GET_ITEM(loc, 2), x, plan);
    if (kind == MANY_KIND)
        return many(g, PyTuple_GET_ITEM(loc, 1), PyTuple_GET_ITEM(loc, 2), x, plan);
    return 0;
}
