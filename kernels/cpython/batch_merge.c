/* merge_batches: the batch-merging post-pass of dynagraph/schedulers/merge.py (its twin,
merge_batches_py, gives the same batches; tests/schedulers/test_merge.py). Each batch, last
first, joins the latest later batch of its signature that runs before the first user of its
nodes; see merge.py for why that keeps a schedule valid. Flat arrays over local node ids
v = id - lo; per signature, the indices of the batches kept so far, in decreasing order (each
kept batch is smaller than the last), searched by bisection. */
#include "bookkeeping.h"
#include "typewise.h"  /* dg_sort_ids */

#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_ssize_t B, lo, n, S;
    Py_ssize_t *pos;        /* batch of each local node, -1 outside the schedule */
    Py_ssize_t *first;      /* earliest final batch of each local node's users (B: none) */
    Py_ssize_t *keep;       /* per signature, from off[s]: kept batch indices, decreasing */
    Py_ssize_t *off, *len;  /* S + 1 and S entries */
    Py_ssize_t *head, *next;/* batches that joined batch t: head[t], then next[...]; -1 ends */
    char *joined;
    PyObject **obj;         /* the caller's int object of each local node (borrowed): no new ints */
    /* flat copies read in the pass (the caller's tuples and ints, read once in recording order, were
       cache misses in every loop): each batch's local nodes and signature, each scheduled node's
       scheduled arguments */
    Py_ssize_t N, *bstart, *bflat, *bsig, *astart, *aflat;
} Merge;

static void merge_free(Merge *m) {
    PyMem_Free(m->pos);
    PyMem_Free(m->first);
    PyMem_Free(m->keep);
    PyMem_Free(m->off);
    PyMem_Free(m->len);
    PyMem_Free(m->head);
    PyMem_Free(m->next);
    PyMem_Free(m->joined);
    PyMem_Free(m->obj);
    PyMem_Free(m->bstart);
    PyMem_Free(m->bflat);
    PyMem_Free(m->bsig);
    PyMem_Free(m->astart);
    PyMem_Free(m->aflat);
}

/* A node id of batch k, checked against the graph's columns; -1 with an exception set. */
static Py_ssize_t node_id(PyObject *o, Py_ssize_t total) {
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= total) {
        PyErr_Format(PyExc_IndexError, "merge_batches: node %zd outside the graph", v);
        return -1;
    }
    return v;
}

/* lo, n and the per-signature counts of batchable batches; checks every batch. */
static int merge_scan(Merge *m, PyObject *batches, PyObject *sig, PyObject *batchable, Py_ssize_t total) {
    Py_ssize_t lo = PY_SSIZE_T_MAX, hi = -1;
    for (Py_ssize_t k = 0; k < m->B; k++) {
        PyObject *b = PyList_GET_ITEM(batches, k);
        if (!PyList_CheckExact(b) || PyList_GET_SIZE(b) == 0) {
            PyErr_Format(PyExc_ValueError, "merge_batches: batch %zd is not a non-empty list", k);
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(b); j++) {
            Py_ssize_t v = node_id(PyList_GET_ITEM(b, j), total);
            if (v < 0)
                return -1;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GET_ITEM(sig, node_id(PyList_GET_ITEM(b, 0), total)));
        if (s == -1 && PyErr_Occurred())
            return -1;
        if (s < 0 || s >= m->S) {
            PyErr_Format(PyExc_IndexError, "merge_batches: signature %zd outside the batchable table", s);
            return -1;
        }
        if (PyList_GET_ITEM(batchable, s) == Py_True)
            m->len[s]++;
        m->bsig[k] = s;
        m->N += PyList_GET_SIZE(b);
    }
    m->lo = lo;
    m->n = hi + 1 - lo;
    return 0;
}

/* Arrays for the pass; pos filled (a node twice is a ValueError). */
static int merge_alloc(Merge *m, PyObject *batches) {
    size_t n = (size_t)m->n, B = (size_t)m->B, S = (size_t)m->S;
    m->pos = PyMem_Malloc(n * sizeof(Py_ssize_t));
    m->first = PyMem_Malloc(n * sizeof(Py_ssize_t));
    m->keep = PyMem_Malloc((B + 1) * sizeof(Py_ssize_t));
    m->off = PyMem_Malloc((S + 1) * sizeof(Py_ssize_t));
    m->head = PyMem_Malloc(B * sizeof(Py_ssize_t));
    m->next = PyMem_Malloc(B * sizeof(Py_ssize_t));
    m->joined = PyMem_Calloc(B, 1);
    m->obj = PyMem_Malloc(n * sizeof(PyObject *));
    m->bstart = PyMem_Malloc((B + 1) * sizeof(Py_ssize_t));
    m->bflat = PyMem_Malloc(((size_t)m->N + 1) * sizeof(Py_ssize_t));
    m->astart = PyMem_Malloc((n + 1) * sizeof(Py_ssize_t));
    if (!m->obj || !m->bstart || !m->bflat || !m->astart || !m->pos || !m->first || !m->keep || !m->off || !m->head || !m->next || !m->joined) {
        PyErr_NoMemory();
        return -1;
    }
    m->off[0] = 0;
    for (size_t s = 0; s < S; s++) {
        m->off[s + 1] = m->off[s] + m->len[s];
        m->len[s] = 0;
    }
    for (size_t v = 0; v < n; v++) {
        m->pos[v] = -1;
        m->first[v] = m->B;
    }
    memset(m->head, 0xff, B * sizeof(Py_ssize_t));  /* -1 */
    Py_ssize_t c = 0;
    for (Py_ssize_t k = 0; k < m->B; k++) {
        PyObject *b = PyList_GET_ITEM(batches, k);
        m->bstart[k] = c;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(b); j++) {
            PyObject *o = PyList_GET_ITEM(b, j);
            Py_ssize_t v = PyLong_AsSsize_t(o) - m->lo;
            m->obj[v] = o;
            m->bflat[c++] = v;
            if (m->pos[v] >= 0) {
                PyErr_Format(PyExc_ValueError, "merge_batches: node %zd is scheduled twice", v + m->lo);
                return -1;
            }
            m->pos[v] = k;
        }
    }
    m->bstart[m->B] = c;
    return 0;
}

/* astart/aflat: the scheduled arguments of each scheduled node, in recording order. */
static int merge_args(Merge *m, PyObject *args) {
    Py_ssize_t cap = 2 * m->N + 16, c = 0;
    m->aflat = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    if (!m->aflat) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < m->n; v++) {
        m->astart[v] = c;
        if (m->pos[v] < 0)
            continue;
        PyObject *as = PyList_GET_ITEM(args, v + m->lo);
        if (!PyTuple_CheckExact(as)) {
            PyErr_SetString(PyExc_TypeError, "merge_batches: argument lists must be tuples");
            return -1;
        }
        Py_ssize_t na = PyTuple_GET_SIZE(as);
        if (c + na > cap) {
            cap = 2 * (c + na);
            Py_ssize_t *grown = PyMem_Realloc(m->aflat, (size_t)cap * sizeof(Py_ssize_t));
            if (!grown) {
                PyErr_NoMemory();
                return -1;
            }
            m->aflat = grown;
        }
        for (Py_ssize_t i = 0; i < na; i++) {
            Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(as, i));
            if (a == -1 && PyErr_Occurred())
                return -1;
            a -= m->lo;
            if (a >= 0 && a < m->n && m->pos[a] >= 0)
                m->aflat[c++] = a;
        }
    }
    m->astart[m->n] = c;
    return 0;
}

/* The kept batch of signature s that batch k joins (the first of the decreasing list at or
   below `last`), or -1; every kept batch comes after k. */
static Py_ssize_t find_target(const Merge *m, Py_ssize_t s, Py_ssize_t last) {
    const Py_ssize_t *keep = m->keep + m->off[s];
    Py_ssize_t a = 0, b = m->len[s];
    while (a < b) {
        Py_ssize_t mid = (a + b) / 2;
        if (keep[mid] > last)
            a = mid + 1;
        else
            b = mid;
    }
    return a < m->len[s] ? keep[a] : -1;
}

/* Batch k's nodes will run in batch `target`: their arguments' first users move up to it. */
static void note_users(Merge *m, Py_ssize_t k, Py_ssize_t target) {
    for (Py_ssize_t j = m->bstart[k]; j < m->bstart[k + 1]; j++) {
        Py_ssize_t v = m->bflat[j];
        for (Py_ssize_t i = m->astart[v]; i < m->astart[v + 1]; i++) {
            Py_ssize_t a = m->aflat[i];
            if (m->first[a] > target)
                m->first[a] = target;
        }
    }
}

/* The pass itself, last batch first. */
static void merge_run(Merge *m, PyObject *batchable) {
    for (Py_ssize_t k = m->B - 1; k >= 0; k--) {
        Py_ssize_t s = m->bsig[k], target = k;
        if (PyList_GET_ITEM(batchable, s) == Py_True) {
            Py_ssize_t last = m->B;
            for (Py_ssize_t j = m->bstart[k]; j < m->bstart[k + 1]; j++) {
                Py_ssize_t f = m->first[m->bflat[j]];
                last = f < last ? f : last;
            }
            Py_ssize_t t = find_target(m, s, last - 1);
            if (t >= 0) {
                target = t;
                m->next[k] = m->head[t];
                m->head[t] = k;
                m->joined[k] = 1;
            } else {
                m->keep[m->off[s] + m->len[s]++] = k;
            }
        }
        note_users(m, k, target);
    }
}

/* Batch t with every batch that joined it, sorted, as a new list. */
static PyObject *joined_batch(const Merge *m, Py_ssize_t t, Py_ssize_t *buf) {
    Py_ssize_t c = 0;
    for (Py_ssize_t k = t; k >= 0; k = (k == t ? m->head[t] : m->next[k]))
        for (Py_ssize_t j = m->bstart[k]; j < m->bstart[k + 1]; j++)
            buf[c++] = m->bflat[j];
    dg_sort_ids(buf, c);  /* local ids sort as the node ids do */
    PyObject *out = PyList_New(c);
    for (Py_ssize_t j = 0; out && j < c; j++) {
        PyObject *v = m->obj[buf[j]];
        Py_INCREF(v);
        PyList_SET_ITEM(out, j, v);
    }
    return out;
}

/* The merged schedule: kept batches in order, unchanged ones as they came. */
static PyObject *merge_emit(const Merge *m, PyObject *batches) {
    PyObject *out = PyList_New(0);
    Py_ssize_t *buf = PyMem_Malloc(((size_t)m->N + 1) * sizeof(Py_ssize_t));
    if (!buf) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t t = 0; out && t < m->B; t++) {
        if (m->joined[t])
            continue;
        PyObject *b = PyList_GET_ITEM(batches, t);
        if (m->head[t] < 0)
            Py_INCREF(b);
        else
            b = joined_batch(m, t, buf);
        if (!b || PyList_Append(out, b) < 0)
            Py_CLEAR(out);
        Py_XDECREF(b);
    }
    PyMem_Free(buf);
    return out;
}

/* merge_batches(batches, args, sig, batchable): see the top of this file. */
PyObject *dg_merge_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !PyList_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "merge_batches(batches, args, sig, batchable: lists)");
        return NULL;
    }
    PyObject *batches = argv[0], *args = argv[1], *sig = argv[2], *batchable = argv[3];
    Py_ssize_t total = PyList_GET_SIZE(args);
    if (PyList_GET_SIZE(sig) != total) {
        PyErr_SetString(PyExc_ValueError, "merge_batches: args and sig lengths differ");
        return NULL;
    }
    Merge m = {0};
    m.B = PyList_GET_SIZE(batches);
    m.S = PyList_GET_SIZE(batchable);
    if (m.B < 2)
        return PyList_GetSlice(batches, 0, m.B);
    m.len = PyMem_Calloc((size_t)m.S + 1, sizeof(Py_ssize_t));
    m.bsig = PyMem_Malloc((size_t)m.B * sizeof(Py_ssize_t));
    PyObject *out = NULL;
    if (!m.len || !m.bsig)
        PyErr_NoMemory();
    else if (merge_scan(&m, batches, sig, batchable, total) == 0 && merge_alloc(&m, batches) == 0 &&
             merge_args(&m, args) == 0) {
        merge_run(&m, batchable);
        /* a schedule's lists hold ints only (no cycles): collecting while they are built only costs time */
#if PY_VERSION_HEX >= 0x030A0000
        int gc_was_on = PyGC_Disable();
#endif
        out = merge_emit(&m, batches);
#if PY_VERSION_HEX >= 0x030A0000
        if (gc_was_on)
            PyGC_Enable();
#endif
    }
    merge_free(&m);
    return out;
}
