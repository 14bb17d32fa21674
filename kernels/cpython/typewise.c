/* Typewise and FSM scheduling bookkeeping (part of dynagraph._bookkeeping; see bookkeeping.h).

The typewise heuristic and the FSM scheduler simulate the pending graph type by type
(dynagraph/schedulers/typewise.py). In Python the per-type frontier graph G_a was built
with frozensets (about 0.5 s on a 36k-node lattice graph) and each step walked Python
dicts; here both are flat arrays. Twin: typewise.Simulation, TypewiseBatching.schedule_py
and FSMScheduler.schedule_py; the compiled path makes exactly the same decisions.

G_a. A type-a node n joins the frontier F_a once every pending type-a ancestor has run.
Any set P(n) of type-a ancestors that covers them (each type-a ancestor is a member or an
ancestor of one) reaches "all run" at the same moment, so the count |P(n)| decremented per
executed member gives the same F_a counts however P(n) was pruned. Per type a, one pass in
recording order computes near(v), the nearest type-a nodes at or above v, as sorted arrays
in a pool, shared between a node and its single contributing argument; a union drops the
members that are G_a parents of other members (which keeps an LSTM's cell chain linear).
*/
#include "bookkeeping.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TW_MAX_DEPTH 20000  /* chains of unbatchable nodes deeper than this: Python decides */

typedef struct {
    Py_ssize_t n, T, S;
    /* graph */
    Py_ssize_t *typ, *indeg, *ustart, *users, *argstart, *argv;
    char *pending;
    PyObject **node;
    /* type graph */
    Py_ssize_t *gpar, *gstart, *gch, *fcount;
    /* ready buckets */
    Py_ssize_t *bstart, *blen, *bucket, *lone, ltop;
    /* near sets */
    Py_ssize_t *pool, pool_len, pool_cap, *near_off, *near_len, *pset_off, *pset_len, *stamp;
    uint64_t *below;
    Py_ssize_t W, depth, steps, unbatchable;
    PyObject *result;
} TW;

static void tw_free_all(TW *s) {
    void *all[] = {s->typ, s->indeg, s->ustart, s->users, s->argstart, s->argv, s->pending, s->node, s->gpar,
                   s->gstart, s->gch, s->fcount, s->bstart, s->blen, s->bucket, s->lone, s->pool, s->near_off,
                   s->near_len, s->pset_off, s->pset_len, s->stamp, s->below};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        PyMem_Free(all[k]);
}

static Py_ssize_t *tw_alloc(Py_ssize_t n) { return PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t)); }

/* Room for k more pool entries; returns 0 or -1 (MemoryError set). */
static int pool_reserve(TW *s, Py_ssize_t k) {
    if (s->pool_len + k <= s->pool_cap)
        return 0;
    Py_ssize_t cap = s->pool_cap ? s->pool_cap : 1024;
    while (cap < s->pool_len + k)
        cap *= 2;
    Py_ssize_t *p = PyMem_Realloc(s->pool, (size_t)cap * sizeof(Py_ssize_t));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    s->pool = p;
    s->pool_cap = cap;
    return 0;
}

static int cmp_ssize_tw(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* The pruned union of pool ranges (xo, xl) and (yo, yl), appended to the pool; its range in *off, *len.
   Members that are G_a parents of other members are dropped (pset holds each typed node's parents). */
/* Whether every member of pool range (xo, xl) is a G_a parent of node q (sorted ranges). */
static int all_parents_of(const TW *s, Py_ssize_t xo, Py_ssize_t xl, Py_ssize_t q) {
    Py_ssize_t pl = s->pset_len[q], j = 0;
    const Py_ssize_t *p = s->pool + s->pset_off[q], *x = s->pool + xo;
    if (pl < xl)
        return 0;
    for (Py_ssize_t i = 0; i < xl; i++) {
        while (j < pl && p[j] < x[i])
            j++;
        if (j == pl || p[j] != x[i])
            return 0;
    }
    return 1;
}

static int near_union(TW *s, Py_ssize_t xo, Py_ssize_t xl, Py_ssize_t yo, Py_ssize_t yl, Py_ssize_t mark,
                      Py_ssize_t *off, Py_ssize_t *len) {
    /* the common case, a node and the cell before it: one side is a single node whose
       G_a parents hold the whole other side, so the union is that side, shared */
    if (yl == 1 && all_parents_of(s, xo, xl, s->pool[yo])) {
        *off = yo;
        *len = 1;
        return 0;
    }
    if (xl == 1 && all_parents_of(s, yo, yl, s->pool[xo])) {
        *off = xo;
        *len = 1;
        return 0;
    }
    if (xl == yl && memcmp(s->pool + xo, s->pool + yo, (size_t)xl * sizeof(Py_ssize_t)) == 0) {
        *off = xo;  /* one set reached along two paths */
        *len = xl;
        return 0;
    }
    if (pool_reserve(s, xl + yl) < 0)
        return -1;
    Py_ssize_t *x = s->pool + xo, *y = s->pool + yo, *out = s->pool + s->pool_len, i = 0, j = 0, m = 0;
    while (i < xl || j < yl) {
        Py_ssize_t v;
        if (j >= yl || (i < xl && x[i] < y[j]))
            v = x[i++];
        else if (i >= xl || y[j] < x[i])
            v = y[j++];
        else {
            v = x[i++];
            j++;
        }
        out[m++] = v;
    }
    for (Py_ssize_t k = 0; k < m; k++)
        s->stamp[out[k]] = mark;
    Py_ssize_t dropped = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t q = out[k];
        for (Py_ssize_t e = 0; e < s->pset_len[q]; e++) {
            Py_ssize_t r = s->pool[s->pset_off[q] + e];
            if (s->stamp[r] == mark) {
                s->stamp[r] = mark - 1;  /* mark - 1 never names a live set: drop r */
                dropped = 1;
            }
        }
    }
    if (dropped) {
        Py_ssize_t w = 0;
        for (Py_ssize_t k = 0; k < m; k++)
            if (s->stamp[out[k]] == mark)
                out[w++] = out[k];
        m = w;
    }
    *off = s->pool_len;
    *len = m;
    s->pool_len += m;
    return 0;
}

/* G_a parents of every typed node (pset), then gpar counts, gch (CSR) and the F_a counts. */
static int type_graph(TW *s) {
    Py_ssize_t n = s->n, T = s->T, W = s->W;
    for (Py_ssize_t v = n - 1; v >= 0; v--) {  /* bit masks of the types strictly below each node */
        uint64_t *bv = s->below + v * W;
        for (Py_ssize_t e = s->ustart[v]; e < s->ustart[v + 1]; e++) {
            Py_ssize_t u = s->users[e];
            uint64_t *bu = s->below + u * W;
            for (Py_ssize_t w = 0; w < W; w++)
                bv[w] |= bu[w];
            if (s->typ[u] >= 0)
                bv[s->typ[u] >> 6] |= (uint64_t)1 << (s->typ[u] & 63);
        }
    }
    /* a node matters to type t when it lies between two type-t nodes, or has type t and one of
       them above or below: per type, the list of such nodes (CSR, recording order) */
    uint64_t *above = PyMem_Calloc((size_t)(n * W) + 1, sizeof(uint64_t));
    Py_ssize_t *tstart = tw_alloc(T + 1), *tlist = NULL, *near_tag = tw_alloc(n);
    int rc = -1;
    if (!above || !tstart || !near_tag)
        goto nomem;
    for (Py_ssize_t v = 0; v < n; v++) {
        uint64_t *av = above + v * W;
        for (Py_ssize_t e = s->argstart[v]; e < s->argstart[v + 1]; e++) {
            Py_ssize_t p = s->argv[e];
            uint64_t *ap = above + p * W;
            for (Py_ssize_t w = 0; w < W; w++)
                av[w] |= ap[w];
            if (s->typ[p] >= 0)
                av[s->typ[p] >> 6] |= (uint64_t)1 << (s->typ[p] & 63);
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t v = 0; v < n; v++) {
            if (!s->pending[v])
                continue;
            Py_ssize_t tv = s->typ[v];
            for (Py_ssize_t w = 0; w < W; w++) {
                uint64_t a = above[v * W + w], b = s->below[v * W + w], m = a & b;
                if (tv >= 0 && (tv >> 6) == w && ((a | b) >> (tv & 63) & 1))
                    m |= (uint64_t)1 << (tv & 63);
                while (m) {
                    Py_ssize_t t = w * 64 + __builtin_ctzll(m);
                    m &= m - 1;
                    if (pass == 0)
                        tstart[t + 1]++;
                    else
                        tlist[tstart[t + 1]++] = v;
                }
            }
        }
        if (pass == 0) {
            for (Py_ssize_t t = 0; t < T; t++)
                tstart[t + 1] += tstart[t];
            if (!(tlist = tw_alloc(tstart[T])))
                goto nomem;
            memmove(tstart + 1, tstart, (size_t)T * sizeof(Py_ssize_t));
            tstart[0] = 0;
        }
    }
    Py_ssize_t mark = 2;
    for (Py_ssize_t t = 0; t < T; t++) {
        for (Py_ssize_t k = tstart[t]; k < tstart[t + 1]; k++) {
            Py_ssize_t v = tlist[k];
            Py_ssize_t uo = 0, ul = 0;
            for (Py_ssize_t e = s->argstart[v]; e < s->argstart[v + 1]; e++) {
                Py_ssize_t p = s->argv[e];
                if (near_tag[p] != t + 1)
                    continue;
                Py_ssize_t po = s->near_off[p], pl = s->near_len[p];
                if (pl == 0 || (po == uo && pl == ul))
                    continue;
                if (ul == 0) {
                    uo = po;
                    ul = pl;
                    continue;
                }
                mark += 2;
                if (near_union(s, uo, ul, po, pl, mark, &uo, &ul) < 0)
                    goto done;
            }
            near_tag[v] = t + 1;
            if (s->typ[v] == t) {
                s->pset_off[v] = uo;
                s->pset_len[v] = ul;
                if (pool_reserve(s, 1) < 0)
                    goto done;
                s->pool[s->pool_len] = v;
                s->near_off[v] = s->pool_len++;
                s->near_len[v] = 1;
            } else {
                s->near_off[v] = uo;
                s->near_len[v] = ul;
            }
        }
    }
    rc = 0;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyMem_Free(above);
    PyMem_Free(tstart);
    PyMem_Free(tlist);
    PyMem_Free(near_tag);
    if (rc < 0)
        return -1;
    /* children lists (CSR) from the parent sets */
    for (Py_ssize_t v = 0; v < n; v++) {
        if (s->typ[v] < 0)
            continue;
        s->gpar[v] = s->pset_len[v];
        if (s->gpar[v] == 0)
            s->fcount[s->typ[v]]++;
        for (Py_ssize_t e = 0; e < s->pset_len[v]; e++)
            s->gstart[s->pool[s->pset_off[v] + e] + 1]++;
    }
    for (Py_ssize_t v = 0; v < n; v++)
        s->gstart[v + 1] += s->gstart[v];
    Py_ssize_t *fill = tw_alloc(n);
    if (!fill || !(s->gch = tw_alloc(s->gstart[n]))) {
        PyMem_Free(fill);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(fill, s->gstart, (size_t)n * sizeof(Py_ssize_t));
    for (Py_ssize_t v = 0; v < n; v++)
        if (s->typ[v] >= 0)
            for (Py_ssize_t e = 0; e < s->pset_len[v]; e++)
                s->gch[fill[s->pool[s->pset_off[v] + e]]++] = v;
    PyMem_Free(fill);
    return 0;
}

/* Append [node ids of local nodes ns[0..m)] to the schedule. */
static int emit(TW *s, const Py_ssize_t *ns, Py_ssize_t m) {
    PyObject *b = PyList_New(m);
    if (!b)
        return -1;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_INCREF(s->node[ns[k]]);
        PyList_SET_ITEM(b, k, s->node[ns[k]]);
    }
    int rc = PyList_Append(s->result, b);
    Py_DECREF(b);
    return rc;
}

/* Simulation._free then _add: count down users; typed ones join their bucket, unbatchable
   ones run at once, alone, in the order found (depth first, like the twin). */
static int tw_release(TW *s, const Py_ssize_t *batch, Py_ssize_t m) {
    if (++s->depth > TW_MAX_DEPTH)
        return 1;
    Py_ssize_t base = s->ltop;
    for (Py_ssize_t k = 0; k < m; k++)
        for (Py_ssize_t e = s->ustart[batch[k]]; e < s->ustart[batch[k] + 1]; e++) {
            Py_ssize_t u = s->users[e];
            if (--s->indeg[u] == 0) {
                Py_ssize_t t = s->typ[u];
                if (t >= 0)
                    s->bucket[s->bstart[t] + s->blen[t]++] = u;
                else
                    s->lone[s->ltop++] = u;
            }
        }
    Py_ssize_t end = s->ltop;
    for (Py_ssize_t i = base; i < end; i++) {
        s->unbatchable++;
        if (emit(s, &s->lone[i], 1) < 0)
            return -1;
        int rc = tw_release(s, &s->lone[i], 1);
        if (rc)
            return rc;
    }
    s->ltop = base;
    s->depth--;
    return 0;
}

/* Simulation.step: run every ready node of type t as one batch (in recording order). */
static int tw_step(TW *s, Py_ssize_t t, int typewise) {
    Py_ssize_t *batch = s->bucket + s->bstart[t], m = s->blen[t];
    s->bstart[t] += m;
    s->blen[t] = 0;
    qsort(batch, (size_t)m, sizeof(Py_ssize_t), cmp_ssize_tw);
    if (typewise) {
        s->fcount[t] -= m;
        for (Py_ssize_t k = 0; k < m; k++)
            for (Py_ssize_t e = s->gstart[batch[k]]; e < s->gstart[batch[k] + 1]; e++)
                if (--s->gpar[s->gch[e]] == 0)
                    s->fcount[t]++;
    }
    s->steps++;
    if (emit(s, batch, m) < 0)
        return -1;
    return tw_release(s, batch, m);
}

/* Simulation.settle: run every type whose whole F_a is ready, in type order, until none is left. */
static int tw_settle(TW *s, Py_ssize_t *full) {
    for (;;) {
        Py_ssize_t k = 0;
        for (Py_ssize_t t = 0; t < s->T; t++)
            if (s->blen[t] > 0 && s->blen[t] == s->fcount[t])
                full[k++] = t;
        if (k == 0)
            return 0;
        for (Py_ssize_t i = 0; i < k; i++) {
            int rc = tw_step(s, full[i], 1);
            if (rc)
                return rc;
        }
    }
}

/* The greedy typewise choice: highest |ready| / |F_a|, then more ready nodes, then lower type. */
static Py_ssize_t choose_typewise(TW *s) {
    Py_ssize_t best = -1;
    double br = 0.0;
    for (Py_ssize_t t = 0; t < s->T; t++) {
        Py_ssize_t m = s->blen[t];
        if (m == 0)
            continue;
        double r = (double)m / (double)s->fcount[t];
        if (best < 0 || r > br || (r == br && m > s->blen[best])) {
            best = t;
            br = r;
        }
    }
    return best;
}

/* The fallback rule (fsm.most_common): most ready nodes, then lower type. */
static Py_ssize_t most_common_c(TW *s) {
    Py_ssize_t best = -1;
    for (Py_ssize_t t = 0; t < s->T; t++)
        if (s->blen[t] > 0 && (best < 0 || s->blen[t] > s->blen[best]))
            best = t;
    return best;
}

typedef struct {
    Py_ssize_t len, v;
} Item;

static int item_cmp(const void *a, const void *b) {  /* (-len, v) ascending */
    const Item *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

/* fsm.encode: the frontier's state tuple, Py_None when a ready type is outside the vocabulary. */
static PyObject *encode_state(TW *s, const Py_ssize_t *vmap, int encoding, Item *items) {
    Py_ssize_t k = 0;
    for (Py_ssize_t t = 0; t < s->T; t++) {
        if (s->blen[t] == 0)
            continue;
        if (vmap[t] < 0)
            Py_RETURN_NONE;
        items[k].len = s->blen[t];
        items[k++].v = vmap[t];
    }
    Py_ssize_t extra = -1;
    if (encoding == 2) {
        qsort(items, (size_t)k, sizeof(Item), item_cmp);
    } else {
        if (encoding == 1) {
            Item top = items[0];
            for (Py_ssize_t i = 1; i < k; i++)
                if (item_cmp(&items[i], &top) < 0)
                    top = items[i];
            extra = top.v;
        }
        for (Py_ssize_t i = 0; i < k; i++)
            items[i].len = 0;  /* base: sort by vocabulary id only */
        qsort(items, (size_t)k, sizeof(Item), item_cmp);
    }
    PyObject *state = PyTuple_New(k + (extra >= 0));
    if (!state)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *v = PyLong_FromSsize_t(items[i].v);
        if (!v) {
            Py_DECREF(state);
            return NULL;
        }
        PyTuple_SET_ITEM(state, i, v);
    }
    if (extra >= 0) {
        PyObject *v = PyLong_FromSsize_t(extra);
        if (!v) {
            Py_DECREF(state);
            return NULL;
        }
        PyTuple_SET_ITEM(state, k, v);
    }
    return state;
}

/* The FSM's action for the current frontier: the table's type when it is ready, else -1. */
static Py_ssize_t fsm_lookup(TW *s, PyObject *table, const Py_ssize_t *vmap, const Py_ssize_t *inv, Py_ssize_t V,
                             int encoding, Item *items, int *err) {
    PyObject *state = encode_state(s, vmap, encoding, items);
    if (!state) {
        *err = 1;
        return -1;
    }
    Py_ssize_t t = -1;
    if (state != Py_None) {
        PyObject *a = PyDict_GetItemWithError(table, state);  /* borrowed */
        if (a && PyLong_Check(a)) {
            Py_ssize_t v = PyLong_AsSsize_t(a);
            if (v == -1 && PyErr_Occurred())
                PyErr_Clear();
            else if (v >= 0 && v < V)
                t = inv[v];
        } else if (!a && PyErr_Occurred()) {
            *err = 1;
        }
    }
    Py_DECREF(state);
    return (t >= 0 && s->blen[t] > 0) ? t : -1;
}

/* Columns of the pending graph: types (dense, first-recorded order), in-degrees, user and
   argument lists (CSR, local ids, duplicates kept like users_of). 1: a signature outside the tables. */
static int tw_graph(TW *s, PyObject *args, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B,
                    Py_ssize_t lo, Py_ssize_t *sig_type) {
    Py_ssize_t n = s->n;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(ids[j]);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < lo || i >= lo + n || (j > 0 && i <= PyLong_AsSsize_t(ids[j - 1]))) {
            PyErr_Format(PyExc_IndexError, "typewise_batches: node ids must increase, got %zd", i);
            return -1;
        }
        long sg = PyLong_AsLong(PyList_GET_ITEM(sig, i));
        if (sg == -1 && PyErr_Occurred())
            return -1;
        if (sg < 0 || sg >= s->S)
            return 1;
        Py_ssize_t v = i - lo;
        s->pending[v] = 1;
        s->node[v] = ids[j];
        if (PyList_GET_ITEM(batchable, sg) == Py_True) {
            if (sig_type[sg] < 0)
                sig_type[sg] = s->T++;
            s->typ[v] = sig_type[sg];
        } else {
            s->typ[v] = -1;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t v = 0; v < n; v++) {
            if (!s->pending[v])
                continue;
            PyObject *t = PyList_GET_ITEM(args, lo + v);
            if (!PyTuple_CheckExact(t)) {
                PyErr_SetString(PyExc_TypeError, "typewise_batches: argument lists must be tuples");
                return -1;
            }
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
                Py_ssize_t u = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, k)) - lo;
                if (PyErr_Occurred())
                    return -1;
                if (u < 0 || u >= n || !s->pending[u])
                    continue;
                if (pass == 0) {
                    s->ustart[u + 1]++;
                    s->argstart[v + 1]++;
                    s->indeg[v]++;
                } else {
                    s->users[s->ustart[u + 1]++] = v;  /* ustart shifted by one while filling */
                    s->argv[s->argstart[v + 1]++] = u;
                }
            }
        }
        if (pass == 0) {
            for (Py_ssize_t v = 0; v < n; v++) {
                s->ustart[v + 1] += s->ustart[v];
                s->argstart[v + 1] += s->argstart[v];
            }
            if (!(s->users = tw_alloc(s->ustart[n])) || !(s->argv = tw_alloc(s->argstart[n]))) {
                PyErr_NoMemory();
                return -1;
            }
            memmove(s->ustart + 1, s->ustart, (size_t)n * sizeof(Py_ssize_t));
            memmove(s->argstart + 1, s->argstart, (size_t)n * sizeof(Py_ssize_t));
            s->ustart[0] = s->argstart[0] = 0;
        }
    }
    return 0;
}

/* typewise_batches(args, sig, batchable, nodes, policy): the typewise heuristic (policy None) or
   the FSM (policy = (table, vocab_by_sig, n_vocab, encoding 0/1/2, settle)). Returns
   (batches, hits, misses), or None when Python must decide (a signature outside the tables,
   a chain of unbatchable nodes too deep). Twins: TypewiseBatching / FSMScheduler.schedule_py. */
PyObject *dg_typewise_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !(PyList_CheckExact(argv[3]) || PyTuple_CheckExact(argv[3]))) {
        PyErr_SetString(PyExc_TypeError, "typewise_batches(args, sig, batchable: lists, nodes, policy)");
        return NULL;
    }
    PyObject *args = argv[0], *sig = argv[1], *batchable = argv[2], *nodes = argv[3], *policy = argv[4];
    PyObject *table = NULL, *vocab = NULL;
    Py_ssize_t V = 0;
    int fsm = policy != Py_None, encoding = 0, settle = 1;
    if (fsm) {
        long e = 0;
        int st = 0;
        if (!PyArg_ParseTuple(policy, "O!O!nlp", &PyDict_Type, &table, &PyList_Type, &vocab, &V, &e, &st))
            return NULL;
        if (e < 0 || e > 2 || V < 0) {
            PyErr_SetString(PyExc_ValueError, "typewise_batches: encoding must be 0, 1 or 2");
            return NULL;
        }
        encoding = (int)e;
        settle = st;
    }
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), total = PyList_GET_SIZE(args);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    if (B == 0)
        return Py_BuildValue("(Nii)", PyList_New(0), 0, 0);
    if (PyList_GET_SIZE(sig) != total || (vocab && PyList_GET_SIZE(vocab) != PyList_GET_SIZE(batchable))) {
        PyErr_SetString(PyExc_ValueError, "typewise_batches: column or table lengths differ");
        return NULL;
    }
    Py_ssize_t lo = PyLong_AsSsize_t(ids[0]), hi = PyLong_AsSsize_t(ids[B - 1]);
    if (PyErr_Occurred())
        return NULL;
    if (lo < 0 || hi >= total || hi < lo) {
        PyErr_Format(PyExc_IndexError, "typewise_batches: nodes [%zd, %zd] outside the graph or not increasing", lo, hi);
        return NULL;
    }
    TW s = {0};
    s.n = hi + 1 - lo;
    s.S = PyList_GET_SIZE(batchable);
    Py_ssize_t n = s.n, hits = 0, misses = 0;
    Py_ssize_t *sig_type = PyMem_Malloc(((size_t)s.S + 1) * sizeof(Py_ssize_t));
    Py_ssize_t *vmap = NULL, *inv = NULL, *full = NULL;
    Item *items = NULL;
    PyObject *out = NULL;
    s.typ = tw_alloc(n);
    s.indeg = tw_alloc(n);
    s.ustart = tw_alloc(n + 1);
    s.argstart = tw_alloc(n + 1);
    s.pending = PyMem_Calloc((size_t)n + 1, 1);
    s.node = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    s.lone = tw_alloc(n);
    s.bucket = tw_alloc(n);
    if (!sig_type || !s.typ || !s.indeg || !s.ustart || !s.argstart || !s.pending || !s.node || !s.lone ||
        !s.bucket) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k <= s.S; k++)
        sig_type[k] = -1;
    for (Py_ssize_t v = 0; v < n; v++)
        s.typ[v] = -1;  /* not pending: no type */
    int rc = tw_graph(&s, args, sig, batchable, ids, B, lo, sig_type);
    if (rc < 0)
        goto done;
    if (rc > 0) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    Py_ssize_t T = s.T;
    s.W = (T + 63) / 64;
    vmap = tw_alloc(T);
    inv = tw_alloc(V);
    full = tw_alloc(T);
    items = PyMem_Calloc((size_t)T + 1, sizeof(Item));
    s.bstart = tw_alloc(T);
    s.blen = tw_alloc(T);
    s.fcount = tw_alloc(T);
    if (!vmap || !inv || !full || !items || !s.bstart || !s.blen || !s.fcount) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t v = 0; v < V; v++)
        inv[v] = -1;
    for (Py_ssize_t sg = 0; sg < s.S; sg++) {
        Py_ssize_t t = sig_type[sg];
        if (t < 0)
            continue;
        vmap[t] = -1;
        if (vocab) {
            Py_ssize_t x = PyLong_AsSsize_t(PyList_GET_ITEM(vocab, sg));
            if (x == -1 && PyErr_Occurred())
                goto done;
            if (x >= 0 && x < V) {
                vmap[t] = x;
                inv[x] = t;
            }
        }
    }
    /* each node joins its type's bucket once: give every type its own range */
    for (Py_ssize_t v = 0; v < n; v++)
        if (s.typ[v] >= 0)
            s.bstart[s.typ[v] + 1]++;
    for (Py_ssize_t t = 0; t < T; t++)
        s.bstart[t + 1] += s.bstart[t];
    int typewise = !fsm || settle;
    if (typewise) {
        s.below = PyMem_Calloc((size_t)(n * s.W) + 1, sizeof(uint64_t));
        s.near_off = tw_alloc(n);
        s.near_len = tw_alloc(n);
        s.pset_off = tw_alloc(n);
        s.pset_len = tw_alloc(n);
        s.stamp = tw_alloc(n);
        s.gpar = tw_alloc(n);
        s.gstart = tw_alloc(n + 1);
        if (!s.below || !s.near_off || !s.near_len || !s.pset_off || !s.pset_len || !s.stamp || !s.gpar ||
            !s.gstart) {
            PyErr_NoMemory();
            goto done;
        }
        if (type_graph(&s) < 0)
            goto done;
    }
    if (!(s.result = PyList_New(0)))
        goto done;
    /* reset: the ready nodes; unbatchable ones run at once */
    rc = 0;
    for (Py_ssize_t v = 0; v < n && rc == 0; v++) {
        if (!s.pending[v] || s.indeg[v] != 0)
            continue;
        if (s.typ[v] >= 0) {
            s.bucket[s.bstart[s.typ[v]] + s.blen[s.typ[v]]++] = v;
        } else {
            s.unbatchable++;
            rc = emit(&s, &v, 1);
            if (rc == 0)
                rc = tw_release(&s, &v, 1);
        }
    }
    for (;;) {
        if (rc)
            break;
        if (fsm && settle && (rc = tw_settle(&s, full)) != 0)
            break;
        Py_ssize_t t = most_common_c(&s);
        if (t < 0)
            break;  /* nothing ready: done */
        if (!fsm) {
            t = choose_typewise(&s);
        } else {
            int err = 0;
            Py_ssize_t a = fsm_lookup(&s, table, vmap, inv, V, encoding, items, &err);
            if (err) {
                rc = -1;
                break;
            }
            if (a >= 0) {
                hits++;
                t = a;
            } else {
                misses++;
            }
        }
        rc = tw_step(&s, t, typewise);
    }
    if (rc < 0)
        goto done;
    if (rc > 0) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    out = Py_BuildValue("(Onn)", s.result, hits, misses);
done:
    Py_XDECREF(s.result);
    PyMem_Free(sig_type);
    PyMem_Free(vmap);
    PyMem_Free(inv);
    PyMem_Free(full);
    PyMem_Free(items);
    tw_free_all(&s);
    return out;
}
