/* Scheduling bookkeeping (part of dynagraph._bookkeeping; see bookkeeping.h).

The depth scheduler is one pass over the pending nodes (depth was computed while
recording), but a Python dict keyed by (depth, signature) still cost about 3 ms per
32k-node graph. Here the pass uses an open-addressing table of int64 keys, sized by the
groups, and counts each group before making its list: callgrind put the pass at 8.5M
instructions a TreeLSTM mini-batch of 30k nodes with a table sized by the nodes, PyLong_AsLong
reads and a list append per node, 3.9M now (bench/instruction_counts.py --suite minibatch,
DYNAGRAPH_SCHEDULER=depth).
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
    long depth, first, sig;
    int alone;         /* runs by itself: never entered in the table */
    Py_ssize_t count;  /* its nodes, counted before its list is made at that size */
    PyObject *nodes;   /* list, owned; NULL until made */
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

/* The open-addressing table from (depth, signature) to a group: cap a power of two, grown
   (rehashed from the groups) past half full, so that it is sized by the groups, not the nodes:
   sized by the nodes, clearing it was a fifth of the pass. */
typedef struct {
    int64_t *keys;
    int32_t *slot;  /* group index, -1: empty */
    size_t cap, used;
    int bits;       /* cap == 1 << bits */
} GroupTable;

/* Fibonacci hashing: the product's top bits, which every bit of the key reaches (its low bits
   see only the signature, and every depth of one signature would share a probe chain). */
static inline size_t table_hash(int64_t key, int bits) {
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static int table_alloc(GroupTable *t, int bits) {
    size_t cap = (size_t)1 << bits;
    t->keys = PyMem_Malloc(cap * sizeof(int64_t));
    t->slot = PyMem_Malloc(cap * sizeof(int32_t));
    t->cap = cap;
    t->bits = bits;
    t->used = 0;
    if (!t->keys || !t->slot)
        return -1;
    memset(t->slot, 0xff, cap * sizeof(int32_t));
    return 0;
}

static void table_free(GroupTable *t) {
    PyMem_Free(t->keys);
    PyMem_Free(t->slot);
}

static inline int64_t group_key(long d, long s) {
    return ((int64_t)d << 32) | (int64_t)s;
}

static inline void table_put(GroupTable *t, int64_t key, Py_ssize_t g) {
    size_t h = table_hash(key, t->bits);
    while (t->slot[h] >= 0)
        h = (h + 1) & (t->cap - 1);
    t->keys[h] = key;
    t->slot[h] = (int32_t)g;
    t->used++;
}

/* The table at four times its size, every batchable group of gs[0..ng) entered again. */
static int table_grow(GroupTable *t, const Group *gs, Py_ssize_t ng) {
    GroupTable bigger;
    if (table_alloc(&bigger, t->bits + 2) < 0) {
        table_free(&bigger);
        return -1;
    }
    for (Py_ssize_t g = 0; g < ng; g++)
        if (!gs[g].alone)
            table_put(&bigger, group_key(gs[g].depth, gs[g].sig), g);
    table_free(t);
    *t = bigger;
    return 0;
}

/* The group of node i at depth d with signature s: found in the table by the key (d, s), or a
   new group, gs[*ng], entered in the table unless the node runs alone. Its index, or -1 with
   MemoryError set. */
static inline Py_ssize_t group_of(GroupTable *t, Group *gs, Py_ssize_t *ng, long d, long s, long i, int alone) {
    int64_t key = group_key(d, s);
    if (!alone) {
        size_t h = table_hash(key, t->bits);
        for (; t->slot[h] >= 0; h = (h + 1) & (t->cap - 1))
            if (t->keys[h] == key)
                return t->slot[h];
    }
    Py_ssize_t g = (*ng)++;
    gs[g] = (Group){.depth = d, .first = i, .sig = s, .alone = alone, .count = 0, .nodes = NULL};
    if (alone)
        return g;
    if (2 * (t->used + 1) > t->cap && table_grow(t, gs, g) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    table_put(t, key, g);
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

/* Node j's group for every pending node (grp), the groups counted (gs, *ng): 1, 0 when a
   node's signature or depth is a placeholder (Python decides), -1 with an error set. */
static int assign_groups(PyObject *depth, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B,
                         GroupTable *t, Group *gs, Py_ssize_t *ng, int32_t *grp) {
    Py_ssize_t n = PyList_GET_SIZE(depth), S = PyList_GET_SIZE(batchable);
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_as_ssize(ids[j]);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "depth_batches: node id %zd out of range [0, %zd)", i, n);
            return -1;
        }
        /* inline reads of the ints (dg_as_ssize): ~50 instructions a node through PyLong_AsLong */
        Py_ssize_t d = dg_as_ssize(PyList_GET_ITEM(depth, i)), s = dg_as_ssize(PyList_GET_ITEM(sig, i));
        if ((d == -1 || s == -1) && PyErr_Occurred())
            return -1;
        if (s < 0 || s >= S || d < 0 || d > INT32_MAX)  /* a placeholder or an unknown signature */
            return 0;
        int alone = PyList_GET_ITEM(batchable, s) != Py_True;
        Py_ssize_t g = group_of(t, gs, ng, (long)d, (long)s, (long)i, alone);
        if (g < 0)
            return -1;
        gs[g].count++;
        grp[j] = (int32_t)g;
    }
    return 1;
}

/* depth_batches(depth, sig, batchable, nodes): the depth scheduler. Nodes grouped by
   (depth, signature), an unbatchable one alone; groups ordered by (depth, first node).
   None when a signature id is outside `batchable` (then Python decides). Two passes: the
   groups are counted first, so each list is made at its size and filled without appends. */
PyObject *dg_depth_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !(PyList_CheckExact(argv[3]) || PyTuple_CheckExact(argv[3]))) {
        PyErr_SetString(PyExc_TypeError, "depth_batches(depth: list, sig: list, batchable: list, nodes)");
        return NULL;
    }
    PyObject *depth = argv[0], *sig = argv[1], *batchable = argv[2], *nodes = argv[3];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), n = PyList_GET_SIZE(depth);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    if (PyList_GET_SIZE(sig) != n) {
        PyErr_SetString(PyExc_ValueError, "depth_batches: depth and sig differ in length");
        return NULL;
    }
    GroupTable table;
    int table_ok = table_alloc(&table, 10) == 0;
    Group *gs = PyMem_Malloc(((size_t)B + 1) * sizeof(Group));  /* gs[0..ng) set as made */
    int32_t *grp = PyMem_Malloc(((size_t)B + 1) * sizeof(int32_t));
    Py_ssize_t ng = 0;
    PyObject *result = NULL;
    if (!table_ok || !gs || !grp) {
        PyErr_NoMemory();
        goto done;
    }
    int got = assign_groups(depth, sig, batchable, ids, B, &table, gs, &ng, grp);
    if (got <= 0) {
        if (got == 0)
            result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t g = 0; g < ng; g++) {
        if (!(gs[g].nodes = PyList_New(gs[g].count)))
            goto done;
        dg_untrack_list(gs[g].nodes);  /* node ids only (bookkeeping.h) */
        gs[g].count = 0;               /* from here: the next free item */
    }
    for (Py_ssize_t j = 0; j < B; j++) {
        Group *q = &gs[grp[j]];
        PyList_SET_ITEM(q->nodes, q->count++, Py_NewRef(ids[j]));
    }
    qsort(gs, (size_t)ng, sizeof(Group), by_depth_then_first);
    result = groups_list(gs, ng);
done:
    table_free(&table);
    PyMem_Free(grp);
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
