/* The agenda schedulers (part of dynagraph._bookkeeping; see bookkeeping.h): DyNet's agenda,
and with lookahead LookaheadBatching's. Twin: AgendaBatching.schedule_py
(dynagraph/schedulers/simple.py). The depth scheduler and the pending-node helpers are in
schedule.c.
*/
#include "bookkeeping.h"
#include "recorder.h"  /* the node table */
#include "typewise.h"  /* dg_sort_ids, shared with the typewise simulation */

#include <stdint.h>
#include <string.h>

typedef struct {
    double avg;
    long cost;
    Py_ssize_t first, sig;
} Entry;

static int entry_less(const Entry *a, const Entry *b) {
    if (a->avg != b->avg)
        return a->avg < b->avg;
    if (a->cost != b->cost)
        return a->cost < b->cost;
    if (a->first != b->first)
        return a->first < b->first;
    return a->sig < b->sig;
}

static void heap_push(Entry *h, Py_ssize_t *n, Entry e) {
    Py_ssize_t k = (*n)++;
    while (k > 0) {
        Py_ssize_t p = (k - 1) / 2;
        if (!entry_less(&e, &h[p]))
            break;
        h[k] = h[p];
        k = p;
    }
    h[k] = e;
}

static Entry heap_pop(Entry *h, Py_ssize_t *n) {
    Entry top = h[0], last = h[--(*n)];
    Py_ssize_t k = 0;
    for (;;) {
        Py_ssize_t c = 2 * k + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && entry_less(&h[c + 1], &h[c]))
            c++;
        if (!entry_less(&h[c], &last))
            break;
        h[k] = h[c];
        k = c;
    }
    if (*n > 0)
        h[k] = last;
    return top;
}

/* Per pending node, in one place: the loops that release users touch all of these for
   the same node, and one cache line per node is what they miss on. */
typedef struct {
    int32_t sig;    /* its signature */
    int32_t indeg;  /* arguments not yet run */
    int32_t other;  /* lookahead: of those, ready ones of another signature */
    int32_t near;   /* lookahead: indeg > 0 and other == indeg */
} AgNode;

typedef struct {  /* every array the agenda needs, freed together */
    AgNode *nd;
    /* int32 where per node or edge: the arrays the release loops walk at random, halved */
    int32_t *start, *users, *fill, *ready;
    Py_ssize_t *bucket_len, *bucket_start, *bucket, *first;
    Py_ssize_t *gid;    /* the node id of each local id (local ids: the nodes' ranks, ascending) */
    int32_t *local;     /* node id - lo -> its local id, or -1 when the node is not pending */
    double *depth_sum;
    long *count, *cost;
    char *batchable, *fresh;
    Entry *heap;
    PyObject **node;  /* the caller's int object per local id (borrowed): no new ints */
    /* lookahead only (NULL otherwise): per signature, its near nodes (AgNode.near: nodes
       one batch of other signatures away from ready); the heap entries agenda_next holds back */
    Py_ssize_t *near_count;
    Entry *held;
} Agenda;

static void agenda_free(Agenda *a) {
    void *all[] = {a->nd, a->start, a->users, a->fill, a->bucket_len, a->bucket_start, a->bucket,
                   a->ready, a->first, a->gid, a->local, a->depth_sum, a->count, a->cost, a->batchable, a->fresh,
                   a->heap, a->node, a->near_count, a->held};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        PyMem_Free(all[k]);
}

/* Lookahead: node v is near when it still waits for arguments and every one it waits for is
   ready and of another signature (AgNode.near); near_count[s] counts signature s's. A node
   becomes near only when an argument becomes ready (agenda_push) or one of its own signature
   runs, and stops being near only by becoming ready (agenda_run): each case checks just that. */
static inline void agenda_set_near(Agenda *a, AgNode *d, int32_t near) {
    d->near = near;
    a->near_count[d->sig] += near ? 1 : -1;
}

/* Mark ready nodes: each joins its signature's bucket; a bucket that was empty gets a
   heap entry keyed by its smallest new node (the Python twin's part[0]). With lookahead,
   each ready node also counts as ready for its users of other signatures. */
static void agenda_push(Agenda *a, const int32_t *ready, Py_ssize_t m, Entry *heap, Py_ssize_t *nheap) {
    if (a->near_count)
        for (Py_ssize_t k = 0; k < m; k++) {
            Py_ssize_t u = ready[k];
            int32_t su = a->nd[u].sig;
            for (Py_ssize_t e = a->start[u]; e < a->start[u + 1]; e++) {
                AgNode *d = &a->nd[a->users[e]];
                if (d->sig != su && ++d->other == d->indeg)  /* it waits for u: indeg > 0 */
                    agenda_set_near(a, d, 1);
            }
        }
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t v = ready[k], s = a->nd[v].sig;
        if (a->bucket_len[s] == 0 && !a->fresh[s]) {
            a->fresh[s] = 1;
            a->first[s] = v;
        } else if (a->fresh[s] && v < a->first[s]) {
            a->first[s] = v;
        }
        a->bucket[a->bucket_start[s] + a->bucket_len[s]++] = v;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t s = a->nd[ready[k]].sig;
        if (a->fresh[s]) {
            a->fresh[s] = 0;
            Entry e = {a->depth_sum[s] / (double)a->count[s], a->cost[s], a->first[s], s};
            heap_push(heap, nheap, e);
        }
    }
}

/* The arguments of agenda_batches, and the range [lo, hi] of its (increasing) node ids.
   1 to go on, 0 for no nodes, -1 with an exception set. */
static int agenda_check(PyObject *const *argv, Py_ssize_t nargs, Py_ssize_t *lo, Py_ssize_t *hi) {
    if (nargs < 6 || nargs > 8 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !PyList_CheckExact(argv[3]) || !PyList_CheckExact(argv[4]) ||
        !(PyList_CheckExact(argv[5]) || PyTuple_CheckExact(argv[5]))) {
        PyErr_SetString(PyExc_TypeError, "agenda_batches(args, sig, depth, batchable, cost: lists, nodes[, lookahead[, cg]])");
        return -1;
    }
    Py_ssize_t B = PySequence_Fast_GET_SIZE(argv[5]), S = PyList_GET_SIZE(argv[3]), total = PyList_GET_SIZE(argv[0]);
    PyObject **ids = PySequence_Fast_ITEMS(argv[5]);
    if (B == 0)
        return 0;
    if (B > INT32_MAX || S > INT32_MAX) {  /* AgNode holds them as int32 */
        PyErr_SetString(PyExc_ValueError, "agenda_batches: more than 2**31 - 1 nodes or signatures");
        return -1;
    }
    if (PyList_GET_SIZE(argv[4]) != S || PyList_GET_SIZE(argv[1]) != total || PyList_GET_SIZE(argv[2]) != total) {
        PyErr_SetString(PyExc_ValueError, "agenda_batches: column or table lengths differ");
        return -1;
    }
    *lo = PyLong_AsSsize_t(ids[0]);
    *hi = PyLong_AsSsize_t(ids[B - 1]);
    if (PyErr_Occurred())
        return -1;
    if (*lo < 0 || *hi >= total || *hi < *lo) {
        PyErr_Format(PyExc_IndexError, "agenda_batches: nodes [%zd, %zd] outside the graph or not increasing", *lo,
                     *hi);
        return -1;
    }
    return 1;
}

/* Every array of the agenda for n local nodes (the pending ones), `range` node ids from lo
   and S signatures (users comes later, once its size is known). Sized by the pending nodes,
   not by their id range: a dy.autobatch_map round schedules a hundred new nodes with a few
   deferred ones recorded rounds before, an id range of the whole graph (it was 5% of a
   DRNN step's instructions, zeroing arrays). 0, or -1 with MemoryError set. */
static int agenda_alloc(Agenda *a, Py_ssize_t n, Py_ssize_t range, Py_ssize_t S) {
    /* zeroed only where counts start from zero (indeg, start): the rest are written before
       they are read, and zeroing a dozen n-sized arrays was a fifth of a call's instructions */
    a->gid = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    a->local = range <= INT32_MAX ? PyMem_Malloc((size_t)range * sizeof(int32_t)) : NULL;
    if (a->local)
        memset(a->local, 0xff, (size_t)range * sizeof(int32_t));  /* -1: not pending */
    a->nd = PyMem_Calloc((size_t)n, sizeof(AgNode));
    a->start = PyMem_Calloc((size_t)n + 1, sizeof(int32_t));
    a->fill = PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    a->ready = PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    a->bucket = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    a->bucket_len = PyMem_Calloc((size_t)S + 1, sizeof(Py_ssize_t));
    a->bucket_start = PyMem_Calloc((size_t)S + 1, sizeof(Py_ssize_t));
    a->first = PyMem_Calloc((size_t)S + 1, sizeof(Py_ssize_t));
    a->depth_sum = PyMem_Calloc((size_t)S + 1, sizeof(double));
    a->count = PyMem_Calloc((size_t)S + 1, sizeof(long));
    a->cost = PyMem_Calloc((size_t)S + 1, sizeof(long));
    a->batchable = PyMem_Calloc((size_t)S + 1, 1);
    a->fresh = PyMem_Calloc((size_t)S + 1, 1);
    a->heap = PyMem_Calloc((size_t)S + 1, sizeof(Entry));
    a->node = PyMem_Malloc((size_t)n * sizeof(PyObject *));
    if (!a->node || !a->gid || !a->local || !a->nd || !a->start || !a->fill || !a->ready
        || !a->bucket || !a->bucket_len || !a->bucket_start || !a->first || !a->depth_sum || !a->count || !a->cost || !a->batchable
        || !a->fresh || !a->heap) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The per-signature tables, then the pending nodes, their signatures and the mean depth per
   signature. 1 to go on, 0 when a node's signature is outside the tables, -1 on error. */
static int agenda_nodes(Agenda *a, PyObject *const *argv, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *sig = argv[1], *depth = argv[2];
    Py_ssize_t B = PySequence_Fast_GET_SIZE(argv[5]), S = PyList_GET_SIZE(argv[3]);
    PyObject **ids = PySequence_Fast_ITEMS(argv[5]);
    for (Py_ssize_t s = 0; s < S; s++) {
        a->batchable[s] = PyList_GET_ITEM(argv[3], s) == Py_True;
        a->cost[s] = PyLong_AsLong(PyList_GET_ITEM(argv[4], s));
    }
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t prev = lo - 1;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_as_ssize(ids[j]);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < lo || i > hi || i <= prev) {
            PyErr_Format(PyExc_IndexError, "agenda_batches: node ids must increase within [%zd, %zd], got %zd", lo, hi, i);
            return -1;
        }
        prev = i;
        Py_ssize_t s = dg_as_ssize(PyList_GET_ITEM(sig, i));
        PyObject *dv = PyList_GET_ITEM(depth, i);  /* depths are ints: skip float()'s slow path */
        double d = PyLong_CheckExact(dv) ? (double)dg_as_ssize(dv) : PyFloat_AsDouble(dv);
        if (PyErr_Occurred())
            return -1;
        if (s < 0 || s >= S)
            return 0;
        a->local[i - lo] = (int32_t)j;
        a->gid[j] = i;
        a->node[j] = ids[j];
        a->nd[j].sig = (int32_t)s;
        a->depth_sum[s] += d;
        a->count[s]++;
    }
    return 1;
}

/* agenda_users' pass over the node table: the ids are int32s already, one array read each.
   The number of pending arguments kept in *arg_io, or -1 with MemoryError set. */
static Py_ssize_t agenda_table_args(Agenda *a, const NodeTable *tab, Py_ssize_t lo, Py_ssize_t n, Py_ssize_t range,
                                    int32_t **arg_io, Py_ssize_t *cap_io) {
    Py_ssize_t m = 0;
    for (Py_ssize_t v = 0; v < n; v++) {
        Py_ssize_t g = a->gid[v], e0 = (Py_ssize_t)tab->start[g], na = (Py_ssize_t)tab->start[g + 1] - e0;
        if (m + na > *cap_io) {
            Py_ssize_t want = 2 * *cap_io + na;
            int32_t *more = PyMem_Realloc(*arg_io, (size_t)want * sizeof(int32_t));
            if (!more) {
                PyErr_NoMemory();
                return -1;
            }
            *arg_io = more;
            *cap_io = want;
        }
        for (Py_ssize_t k = 0; k < na; k++) {
            Py_ssize_t u = tab->arg[e0 + k] - lo;
            if (u < 0 || u >= range || (u = a->local[u]) < 0)
                continue;
            (*arg_io)[m++] = (int32_t)u;
            a->start[u + 1]++;
            a->nd[v].indeg++;
        }
    }
    return m;
}

/* Users of each pending node among the pending nodes (CSR: start, users), and in-degrees.
   One pass reads each node's arguments, from the node table `tab` when given, else from the
   argument tuples (they sit apart in the heap: the cache misses were this scheduler's cost),
   and keeps each node's pending arguments as local ids, node after node (node v's are the next
   indeg[v]); the fill reads those, not the arguments again. 0, or -1 with an exception set. */
static int agenda_users(Agenda *a, PyObject *args, const NodeTable *tab, Py_ssize_t lo, Py_ssize_t n,
                        Py_ssize_t range) {
    Py_ssize_t cap = 2 * n + 16, m = 0;
    int32_t *arg = PyMem_Malloc((size_t)cap * sizeof(int32_t));  /* pending arguments, node by node */
    if (!arg) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    if (tab && (m = agenda_table_args(a, tab, lo, n, range, &arg, &cap)) < 0)
        rc = -1;
    for (Py_ssize_t v = 0; v < n && !rc && !tab; v++) {
        if (v + DG_AHEAD < n)  /* the tuples sit apart in the heap (bookkeeping.h) */
            DG_PREFETCH(PyList_GET_ITEM(args, a->gid[v + DG_AHEAD]));
        if (v + DG_AHEAD / 2 < n && PyTuple_CheckExact(PyList_GET_ITEM(args, a->gid[v + DG_AHEAD / 2]))) {
            PyObject *t2 = PyList_GET_ITEM(args, a->gid[v + DG_AHEAD / 2]);
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t2) && k < 4; k++)
                DG_PREFETCH(PyTuple_GET_ITEM(t2, k));
        }
        PyObject *t = PyList_GET_ITEM(args, a->gid[v]);
        if (!PyTuple_CheckExact(t)) {
            PyErr_SetString(PyExc_TypeError, "agenda_batches: argument lists must be tuples");
            rc = -1;
            break;
        }
        Py_ssize_t na = PyTuple_GET_SIZE(t);
        if (m + na > cap) {
            Py_ssize_t want = 2 * cap + na;
            int32_t *more = PyMem_Realloc(arg, (size_t)want * sizeof(int32_t));
            if (!more) {
                PyErr_NoMemory();
                rc = -1;
                break;
            }
            arg = more;
            cap = want;
        }
        for (Py_ssize_t k = 0; k < na; k++) {
            Py_ssize_t u = dg_as_ssize(PyTuple_GET_ITEM(t, k)) - lo;
            if (PyErr_Occurred()) {
                rc = -1;
                break;
            }
            if (u < 0 || u >= range || (u = a->local[u]) < 0)
                continue;
            arg[m++] = (int32_t)u;
            a->start[u + 1]++;
            a->nd[v].indeg++;
        }
    }
    if (!rc && m >= INT32_MAX) {  /* start, fill and users hold edge positions as int32 */
        PyErr_SetString(PyExc_ValueError, "agenda_batches: more than 2**31 - 1 argument edges");
        rc = -1;
    }
    if (!rc) {
        for (Py_ssize_t v = 0; v < n; v++)
            a->start[v + 1] += a->start[v];
        memcpy(a->fill, a->start, (size_t)(n + 1) * sizeof(int32_t));
        if (!(a->users = PyMem_Malloc(((size_t)a->start[n] + 1) * sizeof(int32_t)))) {
            PyErr_NoMemory();
            rc = -1;
        }
    }
    for (Py_ssize_t v = 0, e = 0; v < n && !rc; v++)
        for (Py_ssize_t k = 0; k < a->nd[v].indeg; k++)
            a->users[a->fill[arg[e++]]++] = (int32_t)v;
    PyMem_Free(arg);
    return rc;
}

/* The m nodes of a popped bucket (local ids in batch) appended to result: one list of m
   nodes, or m lists of one (not batchable), each filled at its final size. 0 or -1. */
static inline int agenda_emit(const Agenda *a, PyObject *result, const Py_ssize_t *batch, Py_ssize_t m,
                              int batchable) {
    Py_ssize_t per = batchable ? m : 1;
    for (Py_ssize_t k = 0; k < m; k += per) {
        PyObject *cur = PyList_New(per);
        dg_untrack_list(cur);  /* node ids only; lives as long as the graph (bookkeeping.h) */
        if (!cur || PyList_Append(result, cur) < 0) {
            Py_XDECREF(cur);
            return -1;
        }
        Py_DECREF(cur);  /* result holds it */
        for (Py_ssize_t q = 0; q < per; q++) {
            PyObject *v = a->node[batch[k + q]];
            Py_INCREF(v);
            PyList_SET_ITEM(cur, q, v);
        }
    }
    return 0;
}

/* The next signature to run: the heap's first. With lookahead, a signature that has near
   nodes (one batch of other signatures would make them ready and join its batch) waits while
   the heap holds one without: the first such runs instead, and the waiting ones go back. When
   every ready signature has near nodes, the first runs (no choice then runs fewer batches). */
static Py_ssize_t agenda_next(Agenda *a, Py_ssize_t *nheap) {
    Entry *held = a->held;
    Entry top = heap_pop(a->heap, nheap);
    if (!a->near_count || a->near_count[top.sig] == 0)
        return top.sig;
    Py_ssize_t nheld = 0, pick = -1;
    held[nheld++] = top;
    while (*nheap > 0) {
        Entry e = heap_pop(a->heap, nheap);
        if (a->near_count[e.sig] == 0) {
            pick = e.sig;
            break;
        }
        held[nheld++] = e;
    }
    Py_ssize_t k = 0;
    if (pick < 0)  /* all wait: the first runs */
        pick = held[k++].sig;
    for (; k < nheld; k++)
        heap_push(a->heap, nheap, held[k]);
    return pick;
}

/* The agenda itself over n local nodes and S signatures: pop the signature the heap ranks
   first (agenda_next), run its whole bucket as batches, release its users. The batches, or NULL. */
static PyObject *agenda_run(Agenda *a, Py_ssize_t n, Py_ssize_t S) {
    /* bucket s holds at most count[s] nodes over the whole run: give each its own range */
    for (Py_ssize_t s = 1; s <= S; s++)
        a->bucket_start[s] = a->bucket_start[s - 1] + a->count[s - 1];
    Py_ssize_t nready = 0, nheap = 0;
    for (Py_ssize_t v = 0; v < n; v++)
        if (a->nd[v].indeg == 0)
            a->ready[nready++] = (int32_t)v;
    PyObject *result = PyList_New(0);
    if (!result)
        return NULL;
    agenda_push(a, a->ready, nready, a->heap, &nheap);
    while (nheap > 0) {
        Py_ssize_t s = agenda_next(a, &nheap);
        Py_ssize_t *batch = a->bucket + a->bucket_start[s], m = a->bucket_len[s];
        a->bucket_start[s] += m;  /* the range is used up: later arrivals go after it */
        a->bucket_len[s] = 0;
        dg_sort_ids(batch, m);  /* recording order */
        if (agenda_emit(a, result, batch, m, a->batchable[s]) < 0) {
            Py_DECREF(result);
            return NULL;
        }
        nready = 0;
        for (Py_ssize_t k = 0; k < m; k++)
            for (Py_ssize_t e = a->start[batch[k]]; e < a->start[batch[k] + 1]; e++) {
                Py_ssize_t v = a->users[e];
                AgNode *d = &a->nd[v];
                if (--d->indeg == 0)
                    a->ready[nready++] = (int32_t)v;
                if (!a->near_count)
                    continue;
                if (d->sig != s)
                    d->other--;
                if (d->indeg == 0 ? d->near : !d->near && d->other == d->indeg)
                    agenda_set_near(a, d, d->indeg != 0);
            }
        agenda_push(a, a->ready, nready, a->heap, &nheap);
    }
    return result;
}

/* agenda_batches(args, sig, depth, batchable, cost, nodes[, lookahead[, cg]]): DyNet's agenda
   scheduler, with lookahead (a true value) LookaheadBatching's; cg, the graph whose args these
   are: its node table is read instead of the tuples. batchable[s], cost[s]: per signature id.
   Twin: AgendaBatching.schedule_py. Returns the batches, or None when a node's signature is
   outside the tables (Python decides). */
PyObject *dg_agenda_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    Py_ssize_t lo = 0, hi = 0;
    int go = agenda_check(argv, nargs, &lo, &hi);
    if (go <= 0)
        return go < 0 ? NULL : PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(argv[5]), range = hi + 1 - lo, S = PyList_GET_SIZE(argv[3]);
    Agenda a = {0};
    PyObject *result = NULL;
    if (agenda_alloc(&a, n, range, S) < 0 || (go = agenda_nodes(&a, argv, lo, hi)) < 0)
        goto done;
    if (go == 0) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    int lookahead = nargs >= 7 ? PyObject_IsTrue(argv[6]) : 0;
    if (lookahead < 0)
        goto done;
    if (lookahead) {
        a.near_count = PyMem_Calloc((size_t)S + 1, sizeof(Py_ssize_t));
        a.held = PyMem_Malloc(((size_t)S + 1) * sizeof(Entry));  /* the heap holds at most S entries */
        if (!a.near_count || !a.held) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* cg given: its node table, when it mirrors argv[0] (else the tuples are read) */
    const NodeTable *tab = nargs == 8 ? dg_table_of(argv[7], argv[0], hi + 1) : NULL;
    if (agenda_users(&a, argv[0], tab, lo, n, range) == 0)
        result = agenda_run(&a, n, S);
done:
    agenda_free(&a);
    return result;
}
