/* Typewise and FSM scheduling: the simulation (part of dynagraph._bookkeeping; see bookkeeping.h).

The typewise heuristic and the FSM scheduler simulate the pending graph type by type
(dynagraph/schedulers/typewise.py). In Python the per-type frontier graph G_a was built
with frozensets (about 0.5 s on a 36k-node lattice graph) and each step walked Python
dicts; here both are flat arrays (G_a in typewise_graph.c). Twins: typewise.Simulation,
TypewiseBatching.schedule_py and FSMScheduler.schedule_py; the compiled path makes exactly
the same decisions (tests/schedulers/test_compiled_typewise.py).
*/
#include "typewise.h"

#include <stdlib.h>
#include <string.h>

#define TW_MAX_DEPTH 20000  /* chains of unbatchable nodes deeper than this: Python decides */

/* Whether type t has ready nodes the decision may see: a tail type's are held while other
   batchable nodes are pending (Simulation.held). */
static inline int shown(const TW *s, Py_ssize_t t) {
    return s->blen[t] > 0 && !(s->nontail > 0 && s->tail && s->tail[t]);
}

/* Local node v of type t becomes ready: it joins t's bucket, and t the list of ready types
   (rlist, rpos: an unordered set kept so that the decisions look at the ready types only,
   not all T). */
static inline void join(TW *s, Py_ssize_t t, Py_ssize_t v) {
    if (s->height)
        s->hready[s->hoff[t] + s->height[v]]++;
    if (s->blen[t] == 0) {
        s->rpos[t] = s->rn;
        s->rlist[s->rn++] = t;
    }
    s->bucket[s->bstart[t] + s->blen[t]++] = v;
}

/* Append [node ids of local nodes ns[0..m)] to the schedule. */
static int emit(TW *s, const Py_ssize_t *ns, Py_ssize_t m) {
    PyObject *b = PyList_New(m);
    if (!b)
        return -1;
    dg_untrack_list(b);  /* node ids only; lives as long as the graph (bookkeeping.h) */
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
                    join(s, t, u);
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
    Py_ssize_t last = s->rlist[--s->rn];  /* t leaves the ready types */
    s->rlist[s->rpos[t]] = last;
    s->rpos[last] = s->rpos[t];
    dg_sort_ids(batch, m);
    if (s->height) {  /* Simulation._lower */
        Py_ssize_t off = s->hoff[t], h;
        for (Py_ssize_t k = 0; k < m; k++) {
            h = s->height[batch[k]];
            s->hcount[off + h]--;
            s->hready[off + h]--;
        }
        for (h = s->top[t]; h > 0 && s->hcount[off + h] == 0;)
            h--;
        s->top[t] = h;
    }
    if (typewise) {
        s->fcount[t] -= m;
        for (Py_ssize_t k = 0; k < m; k++)
            for (Py_ssize_t e = s->gstart[batch[k]]; e < s->gstart[batch[k] + 1]; e++)
                if (--s->gpar[s->gch[e]] == 0)
                    s->fcount[t]++;
    }
    s->steps++;
    if (s->tail && !s->tail[t])
        s->nontail -= m;
    if (emit(s, batch, m) < 0)
        return -1;
    return tw_release(s, batch, m);
}

/* Simulation.settle: run every type whose whole F_a is ready, in type order, until none is left. */
static int tw_settle(TW *s, Py_ssize_t *full) {
    for (;;) {
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0; i < s->rn; i++) {
            Py_ssize_t t = s->rlist[i];
            if (shown(s, t) && s->blen[t] == s->fcount[t])
                full[k++] = t;
        }
        if (k == 0)
            return 0;
        dg_sort_ids(full, k);  /* in type order */
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
    for (Py_ssize_t i = 0; i < s->rn; i++) {
        Py_ssize_t t = s->rlist[i], m = s->blen[t];
        double r = (double)m / (double)s->fcount[t];
        if (best < 0 || r > br || (r == br && (m > s->blen[best] || (m == s->blen[best] && t < best)))) {
            best = t;
            br = r;
        }
    }
    return best;
}

/* The fallback rule (fsm.most_common): most ready nodes, then lower type. */
static Py_ssize_t most_common_c(TW *s) {
    Py_ssize_t best = -1;
    for (Py_ssize_t i = 0; i < s->rn; i++) {
        Py_ssize_t t = s->rlist[i];
        if (shown(s, t) && (best < 0 || s->blen[t] > s->blen[best] || (s->blen[t] == s->blen[best] && t < best)))
            best = t;
    }
    return best;
}

/* Simulation.chain_ready: t's ready nodes hold every pending type-t node of the greatest height. */
static inline int chain_ready(const TW *s, Py_ssize_t t) {
    Py_ssize_t i = s->hoff[t] + s->top[t];
    return s->hready[i] == s->hcount[i];
}

/* fsm.chain_first: among chain_ready types the highest |ready| / |F_a|, then more ready nodes, then
   lower type; when none is chain_ready, the type holding the ready node of the longest path to a
   sink (crit), then lower type. */
static Py_ssize_t chain_first_c(TW *s) {
    Py_ssize_t best = -1, bc = -1;
    double br = 0.0;
    for (Py_ssize_t i = 0; i < s->rn; i++) {
        Py_ssize_t t = s->rlist[i], m = s->blen[t];
        if (!shown(s, t) || !chain_ready(s, t))
            continue;
        double r = (double)m / (double)s->fcount[t];
        if (best < 0 || r > br || (r == br && (m > s->blen[best] || (m == s->blen[best] && t < best)))) {
            best = t;
            br = r;
        }
    }
    if (best >= 0)
        return best;
    for (Py_ssize_t i = 0; i < s->rn; i++) {
        Py_ssize_t t = s->rlist[i], c = 0;
        if (!shown(s, t))
            continue;
        const Py_ssize_t *b = s->bucket + s->bstart[t];
        for (Py_ssize_t k = 0; k < s->blen[t]; k++)
            if (s->crit[b[k]] > c)
                c = s->crit[b[k]];
        if (best < 0 || c > bc || (c == bc && t < best)) {
            best = t;
            bc = c;
        }
    }
    return best;
}

/* Whether some shown type is chain_ready (fsm.allowed). */
static int any_chain_ready(const TW *s) {
    for (Py_ssize_t i = 0; i < s->rn; i++)
        if (shown(s, s->rlist[i]) && chain_ready(s, s->rlist[i]))
            return 1;
    return 0;
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

/* fsm.encode: the frontier's state tuple, Py_None when a ready type is outside the vocabulary.
   encoding 0 base, 1 max, 2 sort, 3 ratio (base of 2 v + [2 |ready| >= |F_a|]; needs the F_a counts),
   4 chain (base of 2 v + chain_ready; needs the chain heights). */
static PyObject *encode_state(TW *s, const Py_ssize_t *vmap, int encoding, Item *items) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < s->rn; i++) {  /* any order: the items are sorted below */
        Py_ssize_t t = s->rlist[i];
        if (!shown(s, t))
            continue;
        if (vmap[t] < 0)
            Py_RETURN_NONE;
        items[k].len = s->blen[t];
        items[k++].v = encoding == 3   ? 2 * vmap[t] + (2 * s->blen[t] >= s->fcount[t])
                       : encoding == 4 ? 2 * vmap[t] + chain_ready(s, t)
                                       : vmap[t];
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
    return (t >= 0 && shown(s, t)) ? t : -1;
}

/* The FSM's side of a call: its table and the per-type vocabulary ids (vmap) and back (inv). */
typedef struct {
    PyObject *table, *vocab;  /* borrowed; vocab: vocabulary id per signature id */
    Py_ssize_t V, *vmap, *inv, *full;
    int on, encoding, settle, hold_tail;
    Item *items;
} Fsm;

/* Unpack the policy argument: None (typewise) or (table, vocab_by_sig, n_vocab, encoding, settle[, hold_tail]). */
static int parse_policy(PyObject *policy, Fsm *f) {
    f->on = policy != Py_None;
    f->settle = 1;
    f->hold_tail = 0;
    if (!f->on)
        return 0;
    long e = 0;
    if (!PyArg_ParseTuple(policy, "O!O!nlp|p", &PyDict_Type, &f->table, &PyList_Type, &f->vocab, &f->V, &e,
                          &f->settle, &f->hold_tail))
        return -1;
    if (e < 0 || e > 4 || f->V < 0) {
        PyErr_SetString(PyExc_ValueError, "typewise_batches: encoding must be 0, 1, 2, 3 or 4");
        return -1;
    }
    f->encoding = (int)e;
    return 0;
}

/* Per-node arrays, then the columns (tw_columns); 1: Python decides. */
static int tw_setup(TW *s, PyObject *args, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B,
                    Py_ssize_t lo, Py_ssize_t *sig_type) {
    Py_ssize_t n = s->n;
    s->typ = tw_alloc(s, n);
    s->indeg = tw_alloc(s, n);
    s->ustart = tw_alloc(s, n + 1);
    s->argstart = tw_alloc(s, n + 1);
    s->pending = tw_zalloc(s, (size_t)n + 1);
    s->node = tw_zalloc(s, ((size_t)n + 1) * sizeof(PyObject *));
    s->lone = tw_alloc_raw(s, n);
    s->bucket = tw_alloc_raw(s, n);
    if (!s->typ || !s->indeg || !s->ustart || !s->argstart || !s->pending || !s->node || !s->lone || !s->bucket) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k <= s->S; k++)
        sig_type[k] = -1;
    for (Py_ssize_t v = 0; v < n; v++)
        s->typ[v] = -1;  /* not pending: no type */
    return tw_columns(s, args, sig, batchable, ids, B, lo, sig_type);
}

/* typewise.tail_types: tail[t] is the least fixed point of "no unbatchable user and every user's
   type a tail type or t" over the type graph (bit rows of W words); then the non-tail count. */
static int tail_types(TW *s) {
    Py_ssize_t T = s->T, W = (T + 63) / 64;
    uint64_t *succ = tw_zalloc(s, ((size_t)(T * W) + 1) * sizeof(uint64_t));
    uint64_t *mask = tw_zalloc(s, ((size_t)W + 1) * sizeof(uint64_t));
    char *blocked = tw_zalloc(s, (size_t)T + 1);
    s->tail = tw_zalloc(s, (size_t)T + 1);
    if (!succ || !mask || !blocked || !s->tail) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < s->n; v++) {
        Py_ssize_t t = s->typ[v];
        if (t < 0)
            continue;
        for (Py_ssize_t e = s->ustart[v]; e < s->ustart[v + 1]; e++) {
            Py_ssize_t tu = s->typ[s->users[e]];
            if (tu < 0)
                blocked[t] = 1;
            else
                succ[t * W + (tu >> 6)] |= (uint64_t)1 << (tu & 63);
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (Py_ssize_t t = 0; t < T; t++) {
            if (s->tail[t] || blocked[t])
                continue;
            int sub = 1;
            for (Py_ssize_t w = 0; w < W && sub; w++) {
                uint64_t own = w == (t >> 6) ? (uint64_t)1 << (t & 63) : 0;  /* a type's own chain */
                sub = (succ[t * W + w] & ~(mask[w] | own)) == 0;
            }
            if (sub) {
                s->tail[t] = 1;
                mask[t >> 6] |= (uint64_t)1 << (t & 63);
                changed = 1;
            }
        }
    }
    for (Py_ssize_t v = 0; v < s->n; v++)
        if (s->typ[v] >= 0 && !s->tail[s->typ[v]])
            s->nontail++;
    return 0;
}

/* Per-type arrays: bucket ranges, F_a counts, the FSM's vocabulary maps; G_a when needed. */
static int tw_types(TW *s, Fsm *f, const Py_ssize_t *sig_type, int typewise) {
    Py_ssize_t n = s->n, T = s->T;
    s->W = (T + 63) / 64;
    f->vmap = tw_alloc(s, T);
    f->inv = tw_alloc(s, f->V);
    f->full = tw_alloc(s, T);
    f->items = tw_zalloc(s, ((size_t)T + 1) * sizeof(Item));
    s->bstart = tw_alloc(s, T);
    s->blen = tw_alloc(s, T);
    s->fcount = tw_alloc(s, T);
    s->rlist = tw_alloc(s, T);
    s->rpos = tw_alloc(s, T);
    if (!f->vmap || !f->inv || !f->full || !f->items || !s->bstart || !s->blen || !s->fcount || !s->rlist ||
        !s->rpos) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < f->V; v++)
        f->inv[v] = -1;
    for (Py_ssize_t sg = 0; sg < s->S; sg++) {
        Py_ssize_t t = sig_type[sg];
        if (t < 0)
            continue;
        f->vmap[t] = -1;
        if (f->vocab) {
            Py_ssize_t x = PyLong_AsSsize_t(PyList_GET_ITEM(f->vocab, sg));
            if (x == -1 && PyErr_Occurred())
                return -1;
            if (x >= 0 && x < f->V) {
                f->vmap[t] = x;
                f->inv[x] = t;
            }
        }
    }
    if (f->hold_tail && tail_types(s) < 0)
        return -1;
    /* each node joins its type's bucket once: give every type its own range */
    for (Py_ssize_t v = 0; v < n; v++)
        if (s->typ[v] >= 0)
            s->bstart[s->typ[v] + 1]++;
    for (Py_ssize_t t = 0; t < T; t++)
        s->bstart[t + 1] += s->bstart[t];
    if (!typewise)
        return 0;
    s->below = tw_zalloc(s, ((size_t)(n * s->W) + 1) * sizeof(uint64_t));
    s->pset_off = tw_alloc(s, n);
    s->pset_len = tw_alloc(s, n);
    s->stamp = tw_alloc(s, n);
    s->gpar = tw_alloc(s, n);
    s->gstart = tw_alloc(s, n + 1);
    if (!s->below || !s->pset_off || !s->pset_len || !s->stamp || !s->gpar ||
        !s->gstart) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = tw_type_graph(s);
    if (rc)
        return rc;  /* -1: error; 1: Python decides */
    return f->on && f->encoding == 4 ? tw_chain_heights(s) : 0;
}

/* Simulation.reset and the decision loop (TypewiseBatching / FSMScheduler.schedule_py). */
static int tw_run(TW *s, Fsm *f, int typewise, Py_ssize_t *hits, Py_ssize_t *misses) {
    int rc = 0;
    for (Py_ssize_t v = 0; v < s->n && rc == 0; v++) {  /* ready nodes; unbatchable ones run at once */
        if (!s->pending[v] || s->indeg[v] != 0)
            continue;
        if (s->typ[v] >= 0) {
            join(s, s->typ[v], v);
        } else {
            s->unbatchable++;
            rc = emit(s, &v, 1);
            if (rc == 0)
                rc = tw_release(s, &v, 1);
        }
    }
    while (rc == 0) {
        if (f->on && f->settle && (rc = tw_settle(s, f->full)) != 0)
            break;
        Py_ssize_t t = most_common_c(s);
        if (t < 0)
            break;  /* nothing ready: done */
        if (!f->on) {
            t = choose_typewise(s);
        } else {
            int err = 0;
            Py_ssize_t a = fsm_lookup(s, f->table, f->vmap, f->inv, f->V, f->encoding, f->items, &err);
            if (err)
                return -1;
            if (a >= 0 && f->encoding == 4 && !chain_ready(s, a) && any_chain_ready(s))
                a = -1;  /* fsm.allowed: the table's type would leave its chain behind */
            if (a >= 0) {
                (*hits)++;
                t = a;
            } else {
                (*misses)++;
                if (f->encoding == 4)
                    t = chain_first_c(s);
            }
        }
        rc = tw_step(s, t, typewise);
    }
    return rc;
}

/* typewise_batches(args, sig, batchable, nodes, policy): the typewise heuristic (policy None) or
   the FSM (policy = (table, vocab_by_sig, n_vocab, encoding 0..4, settle)). Returns
   (batches, hits, misses), or None when Python must decide (a signature outside the tables,
   a chain of unbatchable nodes too deep). Twins: TypewiseBatching / FSMScheduler.schedule_py. */
PyObject *dg_typewise_batches(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyList_CheckExact(argv[0]) || !PyList_CheckExact(argv[1]) || !PyList_CheckExact(argv[2]) ||
        !(PyList_CheckExact(argv[3]) || PyTuple_CheckExact(argv[3]))) {
        PyErr_SetString(PyExc_TypeError, "typewise_batches(args, sig, batchable: lists, nodes, policy)");
        return NULL;
    }
    PyObject *args = argv[0], *sig = argv[1], *batchable = argv[2], *nodes = argv[3];
    Fsm f = {0};
    if (parse_policy(argv[4], &f) < 0)
        return NULL;
    Py_ssize_t B = PySequence_Fast_GET_SIZE(nodes), total = PyList_GET_SIZE(args);
    PyObject **ids = PySequence_Fast_ITEMS(nodes);
    if (B == 0)
        return Py_BuildValue("(Nii)", PyList_New(0), 0, 0);
    if (PyList_GET_SIZE(sig) != total || (f.vocab && PyList_GET_SIZE(f.vocab) != PyList_GET_SIZE(batchable))) {
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
    tw_begin(&s);
    s.n = hi + 1 - lo;
    s.S = PyList_GET_SIZE(batchable);
    Py_ssize_t hits = 0, misses = 0;
    Py_ssize_t *sig_type = PyMem_Malloc(((size_t)s.S + 1) * sizeof(Py_ssize_t));
    PyObject *out = NULL;
    int typewise = !f.on || f.settle || f.encoding >= 3, rc = -1;
    if (!sig_type)
        PyErr_NoMemory();
    else if ((rc = tw_setup(&s, args, sig, batchable, ids, B, lo, sig_type)) == 0 &&
             (rc = tw_types(&s, &f, sig_type, typewise)) == 0) {
        /* the schedule is thousands of small lists of ints (no cycles): collecting while they are
           built only costs time */
#if PY_VERSION_HEX >= 0x030A0000
        int gc_was_on = PyGC_Disable();
#endif
        rc = (s.result = PyList_New(0)) ? tw_run(&s, &f, typewise, &hits, &misses) : -1;
#if PY_VERSION_HEX >= 0x030A0000
        if (gc_was_on)
            PyGC_Enable();
#endif
    }
    if (rc > 0) {
        out = Py_None;
        Py_INCREF(out);
    } else if (rc == 0) {
        out = Py_BuildValue("(Onn)", s.result, hits, misses);
    }
    Py_XDECREF(s.result);
    PyMem_Free(sig_type);
    tw_free_all(&s);
    return out;
}
