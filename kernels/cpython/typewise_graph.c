/* The pending graph and the per-type frontier graphs G_a of the compiled typewise/FSM schedulers
(part of dynagraph._bookkeeping; see typewise.c, bookkeeping.h).

Twins: schedulers.base.users_of and typewise._type_graph.

G_a. A type-a node n joins the frontier F_a once every pending type-a ancestor has run.
Any set P(n) of type-a ancestors that covers them (each type-a ancestor is a member or an
ancestor of one) reaches "all run" at the same moment, so the count |P(n)| decremented per
executed member gives the same F_a counts however P(n) was pruned. Per type a, one pass in
recording order computes near(v), the nearest type-a nodes at or above v, as sorted arrays
in a pool, shared between a node and its single contributing argument; a union drops the
members that are G_a ancestors of other members, found by walking the parent sets (which keeps
an LSTM's cell chain linear: with parents only, the cell state's near set grew by one candidate
gate per step, 158k G_a edges on 32 NER lattices instead of 59k).
*/
#include "typewise.h"

#include <stdlib.h>
#include <string.h>

/* Index of the lowest set bit of m (m != 0). */
static inline int lowest_bit(uint64_t m) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(m);
#else
    int k = 0;
    while (!(m & 1)) {
        m >>= 1;
        k++;
    }
    return k;
#endif
}

/* The arrays of a call come from one arena kept across calls: fresh multi-megabyte allocations
   cost page faults (a quarter of a call on a 36k-node graph). A nested call (a finalizer run by
   the garbage collector while this one builds its result) finds the arena busy and allocates
   from the heap instead; so does a call whose arrays outgrow the arena, which grows it for the next. */
static struct {
    char *base;
    size_t cap, want;
    Py_ssize_t *pool, pool_cap;
    int busy;
} ARENA;

void tw_begin(TW *s) {
    if (ARENA.busy)
        return;
    ARENA.busy = 1;
    s->arena = 1;
    if (ARENA.want > ARENA.cap) {
        PyMem_Free(ARENA.base);
        ARENA.cap = ARENA.want + ARENA.want / 4;
        ARENA.base = PyMem_Malloc(ARENA.cap);
        if (!ARENA.base)
            ARENA.cap = 0;
    }
    ARENA.want = 0;
    s->pool = ARENA.pool;
    s->pool_cap = ARENA.pool_cap;
}

void tw_free_all(TW *s) {
    for (Py_ssize_t k = 0; k < s->n_owned; k++)
        PyMem_Free(s->owned[k]);
    PyMem_Free(s->owned);
    if (s->arena) {
        ARENA.pool = s->pool;
        ARENA.pool_cap = s->pool_cap;
        ARENA.busy = 0;
    } else {
        PyMem_Free(s->pool);
    }
}

/* bytes of memory, zeroed when `zero`, freed by tw_free_all; NULL when out of memory (no exception set). */
static void *tw_get(TW *s, size_t bytes, int zero) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (s->arena) {
        ARENA.want += bytes;
        if (s->used + bytes <= ARENA.cap) {
            void *p = ARENA.base + s->used;
            s->used += bytes;
            if (zero)
                memset(p, 0, bytes);
            return p;
        }
    }
    if (s->n_owned == s->cap_owned) {
        Py_ssize_t cap = s->cap_owned ? 2 * s->cap_owned : 16;
        void **o = PyMem_Realloc(s->owned, (size_t)cap * sizeof(void *));
        if (!o)
            return NULL;
        s->owned = o;
        s->cap_owned = cap;
    }
    void *p = PyMem_Calloc(bytes, 1);
    if (p)
        s->owned[s->n_owned++] = p;
    return p;
}

void *tw_zalloc(TW *s, size_t bytes) { return tw_get(s, bytes, 1); }

static void *tw_get_raw(TW *s, size_t bytes) { return tw_get(s, bytes, 0); }

Py_ssize_t *tw_alloc(TW *s, Py_ssize_t n) { return tw_get(s, ((size_t)n + 1) * sizeof(Py_ssize_t), 1); }

/* n + 1 entries the caller writes before reading (CSR lists, buckets): no zeroing. */
Py_ssize_t *tw_alloc_raw(TW *s, Py_ssize_t n) { return tw_get(s, ((size_t)n + 1) * sizeof(Py_ssize_t), 0); }

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

#define DEEP_PRUNE 4  /* near sets larger than this after dropping parents get the ancestor walk */

/* The union when it is one side already: the common case, a node and the cell before it
   (one side is a single node whose G_a parents hold the whole other side, so the union is
   that side, shared), or one set reached along two paths. 1 with *off, *len set, else 0. */
static int shared_union(const TW *s, Py_ssize_t xo, Py_ssize_t xl, Py_ssize_t yo, Py_ssize_t yl, Py_ssize_t *off,
                        Py_ssize_t *len) {
    if (yl == 1 && all_parents_of(s, xo, xl, s->pool[yo])) {
        *off = yo;
        *len = 1;
        return 1;
    }
    if (xl == 1 && all_parents_of(s, yo, yl, s->pool[xo])) {
        *off = xo;
        *len = 1;
        return 1;
    }
    if (xl == yl && memcmp(s->pool + xo, s->pool + yo, (size_t)xl * sizeof(Py_ssize_t)) == 0) {
        *off = xo;
        *len = xl;
        return 1;
    }
    return 0;
}

/* The sorted union of sorted x (xl) and y (yl) into out; its length. */
static inline Py_ssize_t merge_sorted(const Py_ssize_t *x, Py_ssize_t xl, const Py_ssize_t *y, Py_ssize_t yl,
                                      Py_ssize_t *out) {
    Py_ssize_t i = 0, j = 0, m = 0;
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
    return m;
}

/* Stamps the members that are G_a parents of other members as dropped (stamp: mark = live
   member, mark - 1 = dropped member); *live counts down. Whether any was dropped. */
static inline int drop_parents(TW *s, const Py_ssize_t *out, Py_ssize_t m, Py_ssize_t mark, Py_ssize_t *live) {
    int dropped = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t q = out[k];
        for (Py_ssize_t e = 0; e < s->pset_len[q]; e++) {
            Py_ssize_t r = s->pool[s->pset_off[q] + e];
            if (s->stamp[r] == mark) {
                s->stamp[r] = mark - 1;
                dropped = 1;
                (*live)--;
            }
        }
    }
    return dropped;
}

/* For a set still larger than DEEP_PRUNE: drop the members that are further G_a ancestors of
   others too, walking up the parent sets from each member through nodes recorded after the
   first member (no earlier node leads to one; mark + 1 = visited non-member). Without it an
   LSTM cell state, which passes no tanh, kept every earlier candidate gate (158k G_a edges on
   32 NER lattices, 59k with it). Small sets (trees: a node's two subtrees) skip the walk, which
   finds nothing there. The walk is capped: a capped union keeps a few ancestors, a larger
   cover that counts down to zero at the same moment. Whether any was dropped. */
static int drop_ancestors(TW *s, const Py_ssize_t *out, Py_ssize_t m, Py_ssize_t live, Py_ssize_t mark) {
    int dropped = 0;
    Py_ssize_t lo = out[0], top = 0, budget = 8 * live + 64;
    for (Py_ssize_t k = m - 1; k >= 0 && budget > 0; k--) {
        Py_ssize_t q = out[k];
        for (;;) {
            for (Py_ssize_t e = 0; e < s->pset_len[q]; e++) {
                Py_ssize_t r = s->pool[s->pset_off[q] + e];
                if (r < lo)
                    continue;
                Py_ssize_t st = s->stamp[r];
                if (st == mark) {
                    s->stamp[r] = mark - 1;
                    dropped = 1;
                } else if (st != mark - 1 && st != mark + 1) {
                    s->stamp[r] = mark + 1;
                    s->walk[top++] = r;
                }
            }
            if (top == 0 || --budget <= 0)
                break;
            q = s->walk[--top];
        }
        top = 0;
    }
    return dropped;
}

/* The pruned union of pool ranges (xo, xl) and (yo, yl), appended to the pool; its range in *off, *len.
   Members that are G_a parents of other members are dropped (pset holds each typed node's parents). */
static int near_union(TW *s, Py_ssize_t xo, Py_ssize_t xl, Py_ssize_t yo, Py_ssize_t yl, Py_ssize_t mark,
                      Py_ssize_t *off, Py_ssize_t *len) {
    if (shared_union(s, xo, xl, yo, yl, off, len))
        return 0;
    if (pool_reserve(s, xl + yl) < 0)
        return -1;
    Py_ssize_t *out = s->pool + s->pool_len;
    Py_ssize_t m = merge_sorted(s->pool + xo, xl, s->pool + yo, yl, out);
    for (Py_ssize_t k = 0; k < m; k++)
        s->stamp[out[k]] = mark;
    Py_ssize_t live = m;
    int dropped = drop_parents(s, out, m, mark, &live);
    if (live > DEEP_PRUNE && drop_ancestors(s, out, m, live, mark))
        dropped = 1;
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

/* Bit masks of the types strictly below (users' side) and above (arguments' side) each node. */
static void type_masks(TW *s, uint64_t *above) {
    Py_ssize_t n = s->n, W = s->W;
    for (Py_ssize_t v = n - 1; v >= 0; v--) {
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
}

/* A node matters to type t when it lies between two type-t nodes, or has type t and one of
   them above or below: per type, the list of such nodes (CSR in *tstart, *tlist; recording order).
   A node with one pending argument and another type is left out: its near set for t is its
   argument's, which near_pass finds by hopping up its chain (Hop; about 60% of the entries on lattices).
   The counting pass leaves each node's mask of such types in `above` (read no more after it), so
   the filling pass only walks the bits. */
static int type_lists(TW *s, uint64_t *above, Py_ssize_t *tstart, Py_ssize_t **tlist) {
    Py_ssize_t n = s->n, T = s->T, W = s->W;
    for (Py_ssize_t v = 0; v < n; v++) {
        if (!s->pending[v])
            continue;
        Py_ssize_t tv = s->typ[v];
        int one_arg = s->argstart[v + 1] - s->argstart[v] == 1;
        for (Py_ssize_t w = 0; w < W; w++) {
            uint64_t a = above[v * W + w], b = s->below[v * W + w];
            uint64_t m = one_arg ? 0 : a & b;  /* one argument: only its own type can need v (below) */
            if (tv >= 0 && (tv >> 6) == w && ((a | b) >> (tv & 63) & 1))
                m |= (uint64_t)1 << (tv & 63);
            above[v * W + w] = m;
            while (m) {
                tstart[w * 64 + lowest_bit(m) + 1]++;
                m &= m - 1;
            }
        }
    }
    for (Py_ssize_t t = 0; t < T; t++)
        tstart[t + 1] += tstart[t];
    if (!(*tlist = tw_alloc_raw(s, tstart[T]))) {
        PyErr_NoMemory();
        return -1;
    }
    memmove(tstart + 1, tstart, (size_t)T * sizeof(Py_ssize_t));
    tstart[0] = 0;
    for (Py_ssize_t v = 0; v < n; v++) {
        if (!s->pending[v])
            continue;
        for (Py_ssize_t w = 0; w < W; w++) {
            for (uint64_t m = above[v * W + w]; m; m &= m - 1)
                (*tlist)[tstart[w * 64 + lowest_bit(m) + 1]++] = v;
        }
    }
    return 0;
}

/* What near_pass reads and writes about a node p, in one place (one 64-byte line rather than six
   arrays: the pass reads it for every argument of every listed node, type after type, across a
   graph of megabytes): its pending argument count, first argument, type, and for a one-argument
   node the top of its chain and the types on it (one_arg_chains); then its near set in the current
   pass, tag == t + 1 when computed for type t, and the set's pool range. */
typedef struct {
    Py_ssize_t nargs, arg0, typ, top;
    uint64_t types;
    Py_ssize_t tag, off, len;
} Hop;

/* near(v) for type t along its node list, and pset(v) of its type-t nodes. hop[v].tag == t + 1
   marks a near(v) computed in this pass; any other node has none for t. */
static int near_pass(TW *s, Py_ssize_t t, const Py_ssize_t *list, Py_ssize_t len, Hop *hop,
                     Py_ssize_t *mark) {
    uint64_t bit = (uint64_t)1 << (t & 63);
    for (Py_ssize_t k = 0; k < len; k++) {
        Py_ssize_t v = list[k], uo = 0, ul = 0;
        for (Py_ssize_t e = s->argstart[v]; e < s->argstart[v + 1]; e++) {
            Py_ssize_t p = s->argv[e];
            while (hop[p].tag != t + 1 && hop[p].typ != t && hop[p].nargs == 1) {
                /* a left-out node: its near set is its argument's; a chain without a type-t node
                   (none of it is tagged: one-argument nodes are listed only for their own type)
                   is crossed in one jump */
                if (!(hop[p].types & bit)) {
                    p = hop[p].top;
                    break;
                }
                p = hop[p].arg0;
            }
            if (hop[p].tag != t + 1)
                continue;
            Py_ssize_t po = hop[p].off, pl = hop[p].len;
            if (pl == 0 || (po == uo && pl == ul))
                continue;
            if (ul == 0) {
                uo = po;
                ul = pl;
                continue;
            }
            *mark += 3;
            if (near_union(s, uo, ul, po, pl, *mark, &uo, &ul) < 0)
                return -1;
        }
        hop[v].tag = t + 1;
        if (hop[v].typ == t) {
            s->pset_off[v] = uo;
            s->pset_len[v] = ul;
            if (pool_reserve(s, 1) < 0)
                return -1;
            s->pool[s->pool_len] = v;
            hop[v].off = s->pool_len++;
            hop[v].len = 1;
        } else {
            hop[v].off = uo;
            hop[v].len = ul;
        }
    }
    return 0;
}

/* gpar counts, children lists gch (CSR) and the F_a counts from the parent sets. */
static int children(TW *s) {
    Py_ssize_t n = s->n;
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
    Py_ssize_t *fill = tw_alloc_raw(s, n);
    if (!fill || !(s->gch = tw_alloc_raw(s, s->gstart[n]))) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(fill, s->gstart, (size_t)n * sizeof(Py_ssize_t));
    for (Py_ssize_t v = 0; v < n; v++)
        if (s->typ[v] >= 0)
            for (Py_ssize_t e = 0; e < s->pset_len[v]; e++)
                s->gch[fill[s->pool[s->pset_off[v] + e]]++] = v;
    return 0;
}

/* Each node's Hop; for a one-argument node, the first node up its chain of one-argument nodes
   that has another argument count (top) and the bit mask of the types on the way, itself
   included (types; all bits when types do not fit one word). near_pass crosses such chains. */
static void one_arg_chains(TW *s, Hop *hop) {
    for (Py_ssize_t v = 0; v < s->n; v++) {
        Hop *h = &hop[v];
        h->nargs = s->argstart[v + 1] - s->argstart[v];
        h->typ = s->typ[v];
        h->arg0 = h->nargs ? s->argv[s->argstart[v]] : -1;
        h->top = -1;
        h->types = 0;
        h->tag = 0;  /* no near set yet */
        if (h->nargs != 1)
            continue;
        Py_ssize_t a = h->arg0;
        uint64_t own = s->W > 1 ? ~(uint64_t)0 : s->typ[v] >= 0 ? (uint64_t)1 << s->typ[v] : 0;
        if (hop[a].nargs == 1) {
            h->top = hop[a].top;
            h->types = hop[a].types | own;
        } else {
            h->top = a;
            h->types = own;
        }
    }
}

/* G_a of every type: parent sets (pset), then gpar counts, gch and the F_a counts. */
int tw_type_graph(TW *s) {
    Py_ssize_t n = s->n, T = s->T, mark = 2;
    uint64_t *above = tw_zalloc(s, ((size_t)(n * s->W) + 1) * sizeof(uint64_t));
    Py_ssize_t *tstart = tw_alloc(s, T + 1), *tlist = NULL;
    Hop *hop = tw_get_raw(s, ((size_t)n + 1) * sizeof(Hop));  /* every entry written by one_arg_chains */
    int rc = -1;
    s->walk = tw_alloc_raw(s, n);
    if (!above || !tstart || !hop || !s->walk) {
        PyErr_NoMemory();
        goto done;
    }
    type_masks(s, above);
    one_arg_chains(s, hop);
    if (type_lists(s, above, tstart, &tlist) < 0)
        goto done;
    for (Py_ssize_t t = 0; t < T; t++)
        if (near_pass(s, t, tlist + tstart[t], tstart[t + 1] - tstart[t], hop, &mark) < 0)
            goto done;
    rc = children(s);
done:
    return rc;
}

/* The pending nodes (ids, increasing within [lo, lo + n)) and their types: a batchable
   signature's type in first-recorded order, -1 for one that runs alone. 0, 1 for a
   signature outside the tables, -1 with an exception set. */
static int pending_types(TW *s, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B, Py_ssize_t lo,
                         Py_ssize_t *sig_type) {
    Py_ssize_t prev = lo - 1;
    for (Py_ssize_t j = 0; j < B; j++) {
        Py_ssize_t i = dg_as_ssize(ids[j]);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i <= prev || i >= lo + s->n) {
            PyErr_Format(PyExc_IndexError, "typewise_batches: node ids must increase, got %zd", i);
            return -1;
        }
        prev = i;
        Py_ssize_t sg = dg_as_ssize(PyList_GET_ITEM(sig, i));
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
    return 0;
}

/* The user and argument lists among the pending nodes (CSR, local ids, duplicates kept
   like users_of) and in-degrees. Each argument id is read from its Python int once, into argv in
   node order (which is its CSR order), counting users as it goes; then the users are filled from
   argv. 0, or -1 with an exception set. */
static int pending_edges(TW *s, PyObject *args, Py_ssize_t lo) {
    Py_ssize_t n = s->n, m = 0, cap = 0;
    for (Py_ssize_t v = 0; v < n; v++) {  /* room: every argument of a pending node */
        if (!s->pending[v])
            continue;
        PyObject *t = PyList_GET_ITEM(args, lo + v);
        if (!PyTuple_CheckExact(t)) {
            PyErr_SetString(PyExc_TypeError, "typewise_batches: argument lists must be tuples");
            return -1;
        }
        cap += PyTuple_GET_SIZE(t);
    }
    if (!(s->argv = tw_alloc_raw(s, cap))) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        s->argstart[v] = m;
        if (!s->pending[v])
            continue;
        PyObject *t = PyList_GET_ITEM(args, lo + v);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
            Py_ssize_t u = dg_as_ssize(PyTuple_GET_ITEM(t, k)) - lo;
            if (PyErr_Occurred())
                return -1;
            if (u < 0 || u >= n || !s->pending[u])
                continue;
            s->argv[m++] = u;
            s->ustart[u + 1]++;
        }
        s->indeg[v] = m - s->argstart[v];
    }
    s->argstart[n] = m;
    for (Py_ssize_t v = 0; v < n; v++)
        s->ustart[v + 1] += s->ustart[v];
    if (!(s->users = tw_alloc_raw(s, m))) {
        PyErr_NoMemory();
        return -1;
    }
    /* the users, ustart shifted by one while filling */
    memmove(s->ustart + 1, s->ustart, (size_t)n * sizeof(Py_ssize_t));
    s->ustart[0] = 0;
    for (Py_ssize_t v = 0; v < n; v++)
        for (Py_ssize_t e = s->argstart[v]; e < s->argstart[v + 1]; e++)
            s->users[s->ustart[s->argv[e] + 1]++] = v;
    return 0;
}

/* Columns of the pending graph: types (dense, first-recorded order), in-degrees, user and
   argument lists (CSR, local ids, duplicates kept like users_of). 1: a signature outside the tables. */
int tw_columns(TW *s, PyObject *args, PyObject *sig, PyObject *batchable, PyObject **ids, Py_ssize_t B,
               Py_ssize_t lo, Py_ssize_t *sig_type) {
    int rc = pending_types(s, sig, batchable, ids, B, lo, sig_type);
    return rc ? rc : pending_edges(s, args, lo);
}
