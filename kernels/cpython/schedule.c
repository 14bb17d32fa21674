/* Scheduling bookkeeping (part of dynagraph._bookkeeping; see bookkeeping.h).

The depth scheduler is one pass over the pending nodes (depth was computed while
recording), but a Python dict keyed by (depth, signature) still cost about 3 ms per
32k-node graph. Here the pass uses an open-addressing table of int64 keys.
Twins: DepthBatching.schedule_py (dynagraph/schedulers/simple.py), engine._pending_py.
*/
#include "bookkeeping.h"
#include "typewise.h"  /* dg_sort_ids, shared with the typewise simulation */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* pending(blk, lo, hi): [i for i in range(lo, hi) if blk[i] < 0], the nodes with no value yet. */
PyObject *dg_pending(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "pending(blk: list, lo, hi)");
        return NULL;
    }
    PyObject *blk = argv[0];
    Py_ssize_t lo = PyLong_AsSsize_t(argv[1]), hi = PyLong_AsSsize_t(argv[2]);
    if (PyErr_Occurred())
        return NULL;
    if (lo < 0 || hi > PyList_GET_SIZE(blk) || lo > hi) {
        PyErr_Format(PyExc_IndexError, "pending: range [%zd, %zd) outside [0, %zd)", lo, hi, PyList_GET_SIZE(blk));
        return NULL;
    }
    /* the pending ids kept in one read of blk, then the list made at its size: no appends */
    Py_ssize_t m = 0, *ids = PyMem_Malloc(((size_t)(hi - lo) + 1) * sizeof(Py_ssize_t));
    if (!ids)
        return PyErr_NoMemory();
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t b = dg_as_ssize(PyList_GET_ITEM(blk, i));
        if (b == -1 && PyErr_Occurred()) {
            PyMem_Free(ids);
            return NULL;
        }
        if (b < 0)  /* no value yet */
            ids[m++] = i;
    }
    PyObject *out = PyList_New(m);
    for (Py_ssize_t k = 0; out && k < m; k++) {
        PyObject *v = dg_int(ids[k]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, v);
    }
    if (out)
        dg_untrack_list(out);  /* node ids only */
    PyMem_Free(ids);
    return out;
}

typedef struct {
    long depth, first;
    PyObject *nodes;  /* list, owned */
} Group;

static int by_depth_then_first(const void *a, const void *b) {
    const Group *x = a, *y = b;
    if (x->depth != y->depth)
        return x->depth < y->depth ? -1 : 1;
    return (x->first > y->first) - (x->first < y->first);
}

static void free_groups(Group *gs, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(gs[k].nodes);
    PyMem_Free(gs);
}

/* The group of node i at depth d with signature s: found in the open-addressing table
   (keys, slot; cap a power of two) by the key (d, s), or a new group, gs[*ng], entered in
   the table unless the node runs alone. Its index, or -1 with MemoryError set. */
static inline Py_ssize_t group_of(int64_t *keys, Py_ssize_t *slot, size_t cap, Group *gs, Py_ssize_t *ng, long d,
                                  long s, long i, int alone) {
    Py_ssize_t g = -1;
    size_t h = 0;
    int64_t key = ((int64_t)d << 32) | (int64_t)s;
    if (!alone) {
        h = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
        while (slot[h] >= 0 && keys[h] != key)
            h = (h + 1) & (cap - 1);
        g = slot[h];
    }
    if (g >= 0)
        return g;
    g = (*ng)++;
    gs[g].depth = d;
    gs[g].first = i;
    if (!(gs[g].nodes = PyList_New(0)))
        return -1;
    dg_untrack_list(gs[g].nodes);  /* node ids only (bookkeeping.h) */
    if (!alone) {
        keys[h] = key;
        slot[h] = g;
    }
    return g;
}

/* The groups' node lists as one list, in order (each moved out of gs), or NULL. */
static PyObject *groups_list(Group *gs, Py_ssize_t ng) {
    PyObject *result = PyList_New(ng);
    if (!result)
        return NULL;
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyList_SET_ITEM(result, g, gs[g].nodes);  /* steals */
        gs[g].nodes = NULL;
    }
    return result;
}

/* depth_batches(depth, sig, batchable, nodes): the depth scheduler. Nodes grouped by
   (depth, signature), an unbatchable one alone; groups ordered by (depth, first node).
   None when a signature id is outside `batchable` (then Python decides). */
PyObject *dg_depth_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !(PyList_CheckExact(argv[3]) || PyTuple_CheckExact(argv[3]))) {
        PyErr_SetString(PyExc_TypeError, "depth_batches(depth: list, sig: list, batchable: list, nodes)");
        return NULL;
    }
    PyObject *depth = argv[0], *sig = argv[1], *batchable = argv[2], *nodes = argv[3];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(depth), S = PyList_GET_SIZE(batchable);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    if (PyList_GET_SIZE(sig) != n) {
        PyErr_SetString(PyExc_ValueError, "depth_batches: depth and sig differ in length");
        return NULL;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)B)
        cap <<= 1;
    int64_t *keys = PyMem_Malloc(cap * sizeof(int64_t));
    Py_ssize_t *slot = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    Group *gs = PyMem_Calloc((size_t)B + 1, sizeof(Group));
    Py_ssize_t ng = 0;
    PyObject *result = NULL;
    if (!keys || !slot || !gs) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t k = 0; k < cap; k++)
        slot[k] = -1;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(ids[j]);
        if (i == -1 && PyErr_Occurred())
            goto done;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "depth_batches: node id %zd out of range [0, %zd)", i, n);
            goto done;
        }
        long d = PyLong_AsLong(PyList_GET_ITEM(depth, i)), s = PyLong_AsLong(PyList_GET_ITEM(sig, i));
        if ((d == -1 || s == -1) && PyErr_Occurred())
            goto done;
        if (s < 0 || s >= S || d < 0 || d > INT32_MAX) {  /* a placeholder or an unknown signature */
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        int alone = PyList_GET_ITEM(batchable, s) != Py_True;
        Py_ssize_t g = group_of(keys, slot, cap, gs, &ng, d, s, (long)i, alone);
        if (g < 0 || PyList_Append(gs[g].nodes, ids[j]) < 0)
            goto done;
    }
    qsort(gs, (size_t)ng, sizeof(Group), by_depth_then_first);
    result = groups_list(gs, ng);
done:
    PyMem_Free(keys);
    PyMem_Free(slot);
    if (gs)
        free_groups(gs, ng);
    return result;
}

/* A new bytearray of n int64 (or double) values, and its data. */
static PyObject *new_buffer(Py_ssize_t n, void **data) {
    PyObject *b = PyByteArray_FromStringAndSize(NULL, n * 8);
    *data = b ? PyByteArray_AS_STRING(b) : NULL;
    return b;
}

/* node_arrays(args, sig, depth, lo, n): the columns of nodes [lo, lo+n) as raw int64 /
   float64 buffers for numpy.frombuffer: (counts, flat args - lo, sig, depth). An argument
   outside [lo, lo+n) becomes n (the agenda's "not pending" slot). Twin: PendingGraph. */
PyObject *dg_node_arrays(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "node_arrays(args: list, sig: list, depth: list, lo, n)");
        return NULL;
    }
    PyObject *args = argv[0], *sig = argv[1], *depth = argv[2];
    Py_ssize_t lo = PyLong_AsSsize_t(argv[3]), n = PyLong_AsSsize_t(argv[4]);
    if (PyErr_Occurred())
        return NULL;
    if (lo < 0 || n < 0 || lo + n > PyList_GET_SIZE(args) || lo + n > PyList_GET_SIZE(sig) ||
        lo + n > PyList_GET_SIZE(depth)) {
        PyErr_Format(PyExc_IndexError, "node_arrays: nodes [%zd, %zd) outside the graph", lo, lo + n);
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = lo; i < lo + n; i++) {
        PyObject *a = PyList_GET_ITEM(args, i);
        if (!PyTuple_CheckExact(a)) {
            PyErr_SetString(PyExc_TypeError, "node_arrays: argument lists must be tuples");
            return NULL;
        }
        total += PyTuple_GET_SIZE(a);
    }
    int64_t *counts, *flat, *sigs;
    double *depths;
    PyObject *bc = new_buffer(n, (void **)&counts), *bf = new_buffer(total, (void **)&flat);
    PyObject *bs = new_buffer(n, (void **)&sigs), *bd = new_buffer(n, (void **)&depths);
    if (!bc || !bf || !bs || !bd)
        goto fail;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(args, lo + i);
        Py_ssize_t m = PyTuple_GET_SIZE(a);
        counts[i] = m;
        for (Py_ssize_t j = 0; j < m; j++) {
            Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(a, j));
            if (v == -1 && PyErr_Occurred())
                goto fail;
            flat[k++] = v < lo || v >= lo + n ? n : v - lo;
        }
        long s = PyLong_AsLong(PyList_GET_ITEM(sig, lo + i));
        double d = PyFloat_AsDouble(PyList_GET_ITEM(depth, lo + i));
        if (PyErr_Occurred())
            goto fail;
        sigs[i] = s;
        depths[i] = d;
    }
    return Py_BuildValue("(NNNN)", bc, bf, bs, bd);
fail:
    Py_XDECREF(bc);
    Py_XDECREF(bf);
    Py_XDECREF(bs);
    Py_XDECREF(bd);
    return NULL;
}
