/* dynagraph._coarsen: the per-node pass of automatic coarsening (dynagraph/coarsen/detect.py
 * is its pure-Python twin and the reference it is tested against).
 *
 * find(args, sig, ops, data, pending, max_nodes, max_args)
 *   -> (owner, instances)
 * owner: list over [pending[0], pending[-1]], the instance root of each pending node (-1 elsewhere);
 * instances: [(root, members, key, externals, slots)] for every instance of two or more nodes,
 * with key a flat tuple (sig, nargs, ref, ref, ..., sig, nargs, ...) where a ref is a member
 * position (>= 0) or -1-k for the k-th distinct outside argument.
 *
 * Every index read from the Python lists is bounds-checked; a malformed graph raises. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

static int op_flag(PyObject *op, const char *name) {
    PyObject *v = PyObject_GetAttrString(op, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1 if node n's op may join an instance, 0 if not, -1 on error; cached per signature id
 * (op and which arguments are parameters are parts of the signature). */
static int can_join(PyObject *ops, PyObject *args_n, Py_ssize_t nargs, Py_ssize_t n, Py_ssize_t sg,
                    signed char *cache, Py_ssize_t ncache, Py_ssize_t max_args, Py_ssize_t nnodes,
                    signed char *uses) {
    if (sg >= 0 && sg < ncache && cache[sg] >= 0) return cache[sg];
    PyObject *op = PyList_GET_ITEM(ops, n);
    int leaf = op_flag(op, "leaf"), batchable = op_flag(op, "batchable"), saves = op_flag(op, "saves_ctx");
    int ud = op_flag(op, "uses_data");
    if (leaf < 0 || batchable < 0 || saves < 0 || ud < 0) return -1;
    int ok = nargs > 0 && nargs <= max_args && !leaf && batchable && !saves;
    if (ok && !ud) {
        int all_leaf = 1;
        for (Py_ssize_t i = 0; i < nargs; i++) {
            Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(args_n, i));
            if (a < 0 || a >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); return -1; }
            int l = op_flag(PyList_GET_ITEM(ops, a), "leaf");
            if (l < 0) return -1;
            if (!l) { all_leaf = 0; break; }
        }
        ok = !all_leaf;
    }
    if (sg >= 0 && sg < ncache) { cache[sg] = (signed char)ok; uses[sg] = (signed char)ud; }
    return ok;
}

/* One level of structure: a hash of node n's signature and its arguments' signatures,
 * exactly as detect._shape computes it; 0 on success, -1 with an exception set. */
static int one_level(PyObject *args, PyObject *sig, Py_ssize_t n, Py_ssize_t nnodes, Py_ssize_t *out) {
    PyObject *an = PyList_GET_ITEM(args, n);
    if (!PyTuple_Check(an)) { PyErr_SetString(PyExc_TypeError, "args entries must be tuples"); return -1; }
    Py_ssize_t sg = PyLong_AsSsize_t(PyList_GET_ITEM(sig, n));
    unsigned long long hs = (unsigned long long)(sg + 2), hmask = (1ull << 62) - 1;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(an); j++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
        if (x < 0 || x >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); return -1; }
        Py_ssize_t sx = PyLong_AsSsize_t(PyList_GET_ITEM(sig, x));
        hs = (hs * 1000003ull + (unsigned long long)(sx + 2)) & hmask;
    }
    if (PyErr_Occurred()) return -1;
    *out = (Py_ssize_t)hs;
    return 0;
}

/* A growable open-addressing set of one-level shape hashes (never negative: 62 bits). */
typedef struct { Py_ssize_t *slots; Py_ssize_t cap, used; } ShapeSet;

static size_t mix64(size_t h) {
    h ^= h >> 31; h *= 0x94D049BB133111EBull; h ^= h >> 29;
    return h;
}

static int shapes_has(ShapeSet *t, Py_ssize_t v) {
    if (t->cap == 0) return 0;
    for (size_t i = mix64((size_t)v) & (size_t)(t->cap - 1);; i = (i + 1) & (size_t)(t->cap - 1)) {
        if (t->slots[i] == v) return 1;
        if (t->slots[i] < 0) return 0;
    }
}

static int shapes_add(ShapeSet *t, Py_ssize_t v) {
    if (2 * (t->used + 1) > t->cap) {   /* keep it at most half full: grow and rehash */
        Py_ssize_t cap = t->cap ? 2 * t->cap : 64, *old = t->slots, oc = t->cap;
        Py_ssize_t *slots = malloc(sizeof(Py_ssize_t) * cap);
        if (!slots) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < cap; i++) slots[i] = -1;
        t->slots = slots; t->cap = cap; t->used = 0;
        for (Py_ssize_t i = 0; i < oc; i++)
            if (old[i] >= 0 && shapes_add(t, old[i]) < 0) { free(old); return -1; }
        free(old);
    }
    size_t i = mix64((size_t)v) & (size_t)(t->cap - 1);
    while (t->slots[i] >= 0) {
        if (t->slots[i] == v) return 0;
        i = (i + 1) & (size_t)(t->cap - 1);
    }
    t->slots[i] = v;
    t->used++;
    return 0;
}

/* The cut of the pending nodes into instances (the per-node pass), and the members of each
 * instance as CSR by root: members of the instance rooted at lo + rk are mem[start[rk] ..
 * start[rk + 1]) in ascending id order (instances of two or more nodes only). */
typedef struct {
    Py_ssize_t lo, span, np_, nnodes, ncache;
    Py_ssize_t *owner, *cmin, *size, *sigv, *csig, *start, *mem;
    Py_ssize_t *shape1, *shape, *head, *next_in;  /* per node its one- and two-level hashes; members per root */
    char *ispend, *cmulti, *excl;
    signed char *cache, *uses;
    ShapeSet repeated;   /* shapes of the repetition outputs cut so far (detect.py's module doc) */
} Cut;

/* whether the instance rooted at lo + rk already holds a member with signature sg (by_shape 0)
 * or with one-level hash sg (by_shape 1): a walk over its members, which lie close together */
static int holds(const Cut *c, Py_ssize_t rk, Py_ssize_t sg, int by_shape) {
    const Py_ssize_t *v = by_shape ? c->shape : c->sigv;
    for (Py_ssize_t k = c->head[rk]; k >= 0; k = c->next_in[k])
        if (v[k] == sg) return 1;
    return 0;
}

static void cut_free(Cut *c) {
    free(c->owner); free(c->cmin); free(c->size); free(c->sigv); free(c->csig); free(c->start); free(c->mem);
    free(c->shape1); free(c->shape); free(c->head); free(c->next_in); free(c->repeated.slots);
    free(c->ispend); free(c->cmulti); free(c->excl); free(c->cache); free(c->uses);
}

/* 0 on success (the Cut filled; free it with cut_free either way), -1 with an exception set. */
static int cut_nodes(Cut *c, PyObject *args, PyObject *sig, PyObject *ops, PyObject *data, PyObject *pending,
                     Py_ssize_t max_nodes, Py_ssize_t max_args, Py_ssize_t ncache) {
    memset(c, 0, sizeof(*c));
    Py_ssize_t np_ = PyList_GET_SIZE(pending), nnodes = PyList_GET_SIZE(args);
    c->np_ = np_; c->nnodes = nnodes; c->ncache = ncache;
    if (PyList_GET_SIZE(sig) < nnodes || PyList_GET_SIZE(ops) < nnodes || PyList_GET_SIZE(data) < nnodes) {
        PyErr_SetString(PyExc_ValueError, "node lists of different lengths");
        return -1;
    }
    if (np_ == 0) return 0;
    Py_ssize_t lo = PyLong_AsSsize_t(PyList_GET_ITEM(pending, 0));
    Py_ssize_t hi = PyLong_AsSsize_t(PyList_GET_ITEM(pending, np_ - 1));
    if (lo < 0 || hi >= nnodes || hi < lo) { PyErr_SetString(PyExc_IndexError, "pending ids out of range"); return -1; }
    Py_ssize_t span = hi - lo + 1;
    c->lo = lo; c->span = span;
    c->owner = malloc(sizeof(Py_ssize_t) * span); c->cmin = malloc(sizeof(Py_ssize_t) * span);
    c->size = calloc(span, sizeof(Py_ssize_t)); c->sigv = malloc(sizeof(Py_ssize_t) * span);
    c->csig = malloc(sizeof(Py_ssize_t) * span);   /* signature of the last-recorded consumer */
    c->ispend = calloc(span, 1); c->cmulti = calloc(span, 1); c->excl = calloc(span, 1);
    c->cache = malloc(ncache > 0 ? ncache : 1); c->uses = malloc(ncache > 0 ? ncache : 1);
    c->shape1 = malloc(sizeof(Py_ssize_t) * span);
    c->shape = malloc(sizeof(Py_ssize_t) * span); c->head = malloc(sizeof(Py_ssize_t) * span);
    c->next_in = malloc(sizeof(Py_ssize_t) * span);
    Py_ssize_t *owner = c->owner, *cmin = c->cmin, *size = c->size, *sigv = c->sigv, *csig = c->csig;
    char *ispend = c->ispend, *cmulti = c->cmulti, *excl = c->excl;
    if (!owner || !cmin || !size || !sigv || !csig || !ispend || !cmulti || !excl || !c->cache || !c->uses ||
        !c->shape1 || !c->shape || !c->head || !c->next_in) {
        PyErr_NoMemory();
        return -1;
    }
    memset(c->cache, -1, ncache > 0 ? ncache : 1);
    memset(c->uses, 0, ncache > 0 ? ncache : 1);
    for (Py_ssize_t i = 0; i < span; i++) { owner[i] = -1; cmin[i] = -1; csig[i] = -1; c->head[i] = -1; }
    for (Py_ssize_t i = 0; i < np_; i++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i));
        if (n < lo || n > hi) { PyErr_SetString(PyExc_IndexError, "pending ids not ascending"); return -1; }
        ispend[n - lo] = 1;
        sigv[n - lo] = PyLong_AsSsize_t(PyList_GET_ITEM(sig, n));
    }
    if (PyErr_Occurred()) return -1;
    for (Py_ssize_t i = 0; i < np_; i++) {   /* one level of structure per pending node */
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i));
        if (one_level(args, sig, n, nnodes, &c->shape1[n - lo]) < 0) return -1;
    }
    for (Py_ssize_t i = np_ - 1; i >= 0; i--) {
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i)), k = n - lo, r;
        PyObject *an = PyList_GET_ITEM(args, n);
        if (!PyTuple_Check(an)) { PyErr_SetString(PyExc_TypeError, "args entries must be tuples"); return -1; }
        Py_ssize_t nargs = PyTuple_GET_SIZE(an), sg = sigv[k];
        int ok = can_join(ops, an, nargs, n, sg, c->cache, ncache, max_args, nnodes, c->uses);
        if (ok < 0) return -1;
        /* two levels of structure, hashed exactly as detect._shape2 does */
        unsigned long long hmask = (1ull << 62) - 1;
        unsigned long long hs = (unsigned long long)(c->shape1[k] + 2);
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)), sx;
            if (x < 0 || x >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); return -1; }
            if (x >= lo && x <= hi && ispend[x - lo]) sx = c->shape1[x - lo];
            else if (one_level(args, sig, x, nnodes, &sx) < 0) return -1;
            hs = (hs * 1000003ull + (unsigned long long)(sx + 2)) & hmask;
        }
        Py_ssize_t shape_k = (Py_ssize_t)hs;
        c->shape[k] = shape_k;
        if (!ok) {
            excl[k] = 1;
            owner[k] = r = n;
        } else {
            Py_ssize_t m = cmin[k];
            int rep = shapes_has(&c->repeated, shape_k);
            if (rep < 0) return -1;
            if (m < 0 || excl[m - lo] || size[m - lo] >= max_nodes || rep) {
                r = n;
            } else if (!cmulti[k]) {
                /* shaped like a member, or read like the root: the previous repetition */
                int cut = holds(c, m - lo, shape_k, 1);
                if (!cut && sg == sigv[m - lo] && csig[m - lo] >= 0 && csig[m - lo] == csig[k]) cut = 1;
                r = cut ? n : m;
                if (cut && shapes_add(&c->repeated, shape_k) < 0) return -1;
            } else if (!holds(c, m - lo, sg, 0)) {
                r = m;
            } else {
                r = n;
            }
            owner[k] = r;
            size[r - lo] += 1;
            c->next_in[k] = c->head[r - lo];
            c->head[r - lo] = k;
        }
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
            Py_ssize_t q = x - lo;
            if (q >= 0 && q < span && ispend[q]) {
                if (csig[q] < 0) csig[q] = sg;
                if (cmin[q] < 0) cmin[q] = r;
                else if (cmin[q] != r) { cmulti[q] = 1; if (r < cmin[q]) cmin[q] = r; }
            }
        }
    }
    if (PyErr_Occurred()) return -1;
    /* members per instance, in id order: count, then fill (CSR by root) */
    c->start = calloc(span + 1, sizeof(Py_ssize_t));
    if (!c->start) { PyErr_NoMemory(); return -1; }
    Py_ssize_t *start = c->start;
    for (Py_ssize_t k = 0; k < span; k++)
        if (ispend[k] && !excl[k] && size[owner[k] - lo] > 1) start[owner[k] - lo + 1]++;
    for (Py_ssize_t k = 0; k < span; k++) start[k + 1] += start[k];
    Py_ssize_t *fill = malloc(sizeof(Py_ssize_t) * (span + 1));
    c->mem = malloc(sizeof(Py_ssize_t) * (start[span] + 1));
    if (!fill || !c->mem) { free(fill); PyErr_NoMemory(); return -1; }
    memcpy(fill, start, sizeof(Py_ssize_t) * (span + 1));
    for (Py_ssize_t k = 0; k < span; k++)
        if (ispend[k] && !excl[k] && size[owner[k] - lo] > 1) c->mem[fill[owner[k] - lo]++] = k + lo;
    free(fill);
    return 0;
}

/* The canonical key of the instance rooted at lo + rk (members mem[b..e)) into key[] (sig,
 * nargs, refs per member) and its outside arguments into ext[] in first-use order; returns
 * the key's length and sets *next to the number of outside arguments. pos[] (span entries,
 * all -1) is scratch and left all -1. */
static Py_ssize_t instance_key(Cut *c, PyObject *args, Py_ssize_t rk, Py_ssize_t *pos, Py_ssize_t *key,
                               Py_ssize_t *ext, Py_ssize_t *next) {
    Py_ssize_t b = c->start[rk], e = c->start[rk + 1], kk = 0, nx = 0, lo = c->lo, span = c->span;
    for (Py_ssize_t t = b; t < e; t++) {
        Py_ssize_t n = c->mem[t];
        pos[n - lo] = t - b;
        PyObject *an = PyList_GET_ITEM(args, n);
        Py_ssize_t nargs = PyTuple_GET_SIZE(an);
        key[kk++] = c->sigv[n - lo];
        key[kk++] = nargs;
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)), q = x - lo, ref;
            if (q >= 0 && q < span && pos[q] >= 0 && c->owner[q] == rk + lo && !c->excl[q]) {
                ref = pos[q];
            } else {
                Py_ssize_t f = 0;
                while (f < nx && ext[f] != x) f++;
                if (f == nx) ext[nx++] = x;
                ref = -1 - f;
            }
            key[kk++] = ref;
        }
    }
    for (Py_ssize_t t = b; t < e; t++) pos[c->mem[t] - lo] = -1;
    *next = nx;
    return kk;
}

/* The per-node data of an instance's members whose op uses data, as a tuple. */
static PyObject *instance_slots(Cut *c, PyObject *data, Py_ssize_t rk) {
    Py_ssize_t b = c->start[rk], e = c->start[rk + 1], cnt = 0;
    for (Py_ssize_t t = b; t < e; t++) {
        Py_ssize_t sg = c->sigv[c->mem[t] - c->lo];
        if (sg >= 0 && sg < c->ncache && c->uses[sg] > 0) cnt++;
    }
    PyObject *out = PyTuple_New(cnt);
    if (!out) return NULL;
    cnt = 0;
    for (Py_ssize_t t = b; t < e; t++) {
        Py_ssize_t n = c->mem[t], sg = c->sigv[n - c->lo];
        if (sg >= 0 && sg < c->ncache && c->uses[sg] > 0) {
            PyObject *d = PyList_GET_ITEM(data, n);
            Py_INCREF(d);
            PyTuple_SET_ITEM(out, cnt++, d);
        }
    }
    return out;
}

static PyObject *ssize_list(const Py_ssize_t *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);
        if (!x) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

static PyObject *ssize_tuple(const Py_ssize_t *v, Py_ssize_t n) {
    PyObject *out = PyTuple_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);
        if (!x) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

static PyObject *find(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *args, *sig, *ops, *data, *pending;
    Py_ssize_t max_nodes, max_args, ncache;
    if (!PyArg_ParseTuple(a, "O!O!O!O!O!nnn", &PyList_Type, &args, &PyList_Type, &sig, &PyList_Type, &ops,
                          &PyList_Type, &data, &PyList_Type, &pending, &max_nodes, &max_args, &ncache))
        return NULL;
    if (PyList_GET_SIZE(pending) == 0) return Py_BuildValue("([][])");
    Cut c;
    PyObject *owner_list = NULL, *out = NULL, *result = NULL;
    Py_ssize_t *pos = NULL, *key = NULL, *ext = NULL;
    if (cut_nodes(&c, args, sig, ops, data, pending, max_nodes, max_args, ncache) < 0) goto done;
    Py_ssize_t span = c.span, lo = c.lo;
    Py_ssize_t wide = max_nodes * (2 + (max_args > 0 ? max_args : 1)) + 1;
    pos = malloc(sizeof(Py_ssize_t) * span);
    key = malloc(sizeof(Py_ssize_t) * wide);
    ext = malloc(sizeof(Py_ssize_t) * wide);
    if (!pos || !key || !ext) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < span; k++) pos[k] = -1;
    out = PyList_New(0);
    if (!out) goto done;
    for (Py_ssize_t rk = 0; rk < span; rk++) {
        Py_ssize_t b = c.start[rk], e = c.start[rk + 1], next = 0;
        if (e - b < 2) continue;
        Py_ssize_t nkey = instance_key(&c, args, rk, pos, key, ext, &next);
        if (PyErr_Occurred()) goto done;
        PyObject *item = Py_BuildValue("(nNNNN)", rk + lo, ssize_list(c.mem + b, e - b), ssize_tuple(key, nkey),
                                       ssize_list(ext, next), instance_slots(&c, data, rk));
        if (!item || PyList_Append(out, item) < 0) { Py_XDECREF(item); goto done; }
        Py_DECREF(item);
    }
    owner_list = ssize_list(c.owner, span);
    if (owner_list) result = PyTuple_Pack(2, owner_list, out);
done:
    Py_XDECREF(owner_list);
    Py_XDECREF(out);
    free(pos); free(key); free(ext);
    cut_free(&c);
    return result;
}

/* ------------------------------------------------------------------ plan() */
static size_t hash_words(const Py_ssize_t *k, Py_ssize_t n) {
    size_t h = 1469598103934665603ull ^ (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) { h ^= (size_t)k[i]; h *= 1099511628211ull; h ^= h >> 29; }
    return h;
}

/* 1 if op.batchable, cached per signature in bcache (-1 unknown), -1 on error */
static int batchable_of(PyObject *ops, Py_ssize_t n, Py_ssize_t sg, signed char *bcache, Py_ssize_t ncache) {
    if (sg >= 0 && sg < ncache && bcache[sg] >= 0) return bcache[sg];
    int b = op_flag(PyList_GET_ITEM(ops, n), "batchable");
    if (b >= 0 && sg >= 0 && sg < ncache) bcache[sg] = (signed char)b;
    return b;
}

typedef struct { Py_ssize_t lv, tag, first, count, at; int kind; } Group;

static Group *sort_groups;
static int group_order(const void *x, const void *y) {
    const Group *a = &sort_groups[*(const Py_ssize_t *)x], *b = &sort_groups[*(const Py_ssize_t *)y];
    if (a->lv != b->lv) return a->lv < b->lv ? -1 : 1;
    return a->first < b->first ? -1 : (a->first > b->first);
}

/* plan(args, sig, ops, data, pending, max_nodes, max_args, n_signatures, min_calls, defer_height)
 *   -> (patterns, batches)
 * patterns: [(key, members, externals, instances)] for each key held by min_calls or more
 * instances, in order of first instance, with that first instance's members and outside
 * arguments (detect.find_patterns, as detect.heads gives them); batches: the unit schedule
 * (coarsen.run.Coarsened.schedule_py, as detect.payloads gives it) by unit depth then first
 * unit: (-1, [node ids]) for an op-level batch, (pattern index, (members, externals, slots))
 * for a group, with per member position and per outside argument a tuple of node ids (one
 * per instance) and per instance a tuple of its per-node data. */
static PyObject *plan(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *args, *sig, *ops, *data, *pending;
    Py_ssize_t max_nodes, max_args, ncache, min_calls, DEFER_HEIGHT;
    if (!PyArg_ParseTuple(a, "O!O!O!O!O!nnnnn", &PyList_Type, &args, &PyList_Type, &sig, &PyList_Type, &ops,
                          &PyList_Type, &data, &PyList_Type, &pending, &max_nodes, &max_args, &ncache, &min_calls,
                          &DEFER_HEIGHT))
        return NULL;
    if (PyList_GET_SIZE(pending) == 0) return Py_BuildValue("([][])");
    Cut c;
    PyObject *pats = NULL, *batches = NULL, *result = NULL;
    Py_ssize_t *pos = NULL, *keybuf = NULL, *extbuf = NULL, *koff = NULL, *eoff = NULL, *iroot = NULL;
    Py_ssize_t *ipat = NULL, *iw = NULL, *pfirst = NULL, *pcount = NULL, *pkept = NULL, *ptab = NULL;
    Py_ssize_t *kept_inst = NULL, *uindex = NULL, *gtab = NULL, *order = NULL, *kfirst = NULL;
    Py_ssize_t *ulv = NULL, *ukind = NULL, *utag = NULL, *ufirst = NULL, *uheight = NULL, *efrom = NULL, *eto = NULL;
    char *udefer = NULL;
    Py_ssize_t *ugroup = NULL, *upay = NULL, *gunits = NULL;
    signed char *bcache = NULL;
    Group *groups = NULL;
    Py_ssize_t ng = 0, ninst = 0, npat = 0, nkept = 0;
    if (cut_nodes(&c, args, sig, ops, data, pending, max_nodes, max_args, ncache) < 0) goto done;
    Py_ssize_t span = c.span, lo = c.lo;
    /* keys and externals of every instance, in ascending root order */
    Py_ssize_t total_key = 0, total_ext = 0;
    for (Py_ssize_t rk = 0; rk < span; rk++) {
        Py_ssize_t b = c.start[rk], e = c.start[rk + 1];
        if (e - b < 2) continue;
        ninst++;
        for (Py_ssize_t t = b; t < e; t++) {
            Py_ssize_t na = PyTuple_GET_SIZE(PyList_GET_ITEM(args, c.mem[t]));
            total_key += 2 + na;
            total_ext += na;
        }
    }
    pos = malloc(sizeof(Py_ssize_t) * span);
    keybuf = malloc(sizeof(Py_ssize_t) * (total_key + 1)); extbuf = malloc(sizeof(Py_ssize_t) * (total_ext + 1));
    koff = malloc(sizeof(Py_ssize_t) * (ninst + 1)); eoff = malloc(sizeof(Py_ssize_t) * (ninst + 1));
    iroot = malloc(sizeof(Py_ssize_t) * (ninst + 1)); ipat = malloc(sizeof(Py_ssize_t) * (ninst + 1));
    iw = malloc(sizeof(Py_ssize_t) * (ninst + 1));
    pfirst = malloc(sizeof(Py_ssize_t) * (ninst + 1)); pcount = calloc(ninst + 1, sizeof(Py_ssize_t));
    pkept = malloc(sizeof(Py_ssize_t) * (ninst + 1)); kfirst = malloc(sizeof(Py_ssize_t) * (ninst + 1));
    Py_ssize_t pcap = 16;
    while (pcap < 2 * ninst + 16) pcap <<= 1;
    ptab = malloc(sizeof(Py_ssize_t) * pcap);
    if (!pos || !keybuf || !extbuf || !koff || !eoff || !iroot || !ipat || !iw || !pfirst || !pcount || !pkept ||
        !kfirst || !ptab) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < span; k++) pos[k] = -1;
    for (Py_ssize_t k = 0; k < pcap; k++) ptab[k] = -1;
    {
        Py_ssize_t i = 0, kk = 0, ee = 0;
        for (Py_ssize_t rk = 0; rk < span; rk++) {
            if (c.start[rk + 1] - c.start[rk] < 2) continue;
            Py_ssize_t next = 0, nkey = instance_key(&c, args, rk, pos, keybuf + kk, extbuf + ee, &next);
            koff[i] = kk; eoff[i] = ee; iroot[i] = rk;
            kk += nkey; ee += next;
            /* the instance's pattern: an equal key seen before, or a new one */
            size_t h = hash_words(keybuf + koff[i], nkey) & (size_t)(pcap - 1);
            for (;;) {
                Py_ssize_t p = ptab[h];
                if (p < 0) { ptab[h] = p = npat++; pfirst[p] = i; }
                Py_ssize_t f = pfirst[p], flen = koff[f + 1 > i ? i : f + 1] - koff[f];
                if (f == i || (flen == nkey && memcmp(keybuf + koff[f], keybuf + koff[i], sizeof(Py_ssize_t) * nkey) == 0)) {
                    ipat[i] = p;
                    iw[i] = pcount[p]++;
                    break;
                }
                h = (h + 1) & (size_t)(pcap - 1);
            }
            i++;
            koff[i] = kk; eoff[i] = ee;
        }
    }
    /* the patterns kept, in order of first instance: (key, members, externals, instances) of
     * their first instance */
    pats = PyList_New(0);
    if (!pats) goto done;
    for (Py_ssize_t p = 0; p < npat; p++) {
        pkept[p] = -1;
        if (pcount[p] < min_calls) continue;
        pkept[p] = nkept;
        kfirst[nkept++] = p;
        Py_ssize_t f = pfirst[p], rk = iroot[f];
        PyObject *item = Py_BuildValue("(NNNn)", ssize_tuple(keybuf + koff[f], koff[f + 1] - koff[f]),
                                       ssize_tuple(c.mem + c.start[rk], c.start[rk + 1] - c.start[rk]),
                                       ssize_tuple(extbuf + eoff[f], eoff[f + 1] - eoff[f]), pcount[p]);
        if (!item || PyList_Append(pats, item) < 0) { Py_XDECREF(item); goto done; }
        Py_DECREF(item);
    }
    /* the unit schedule (run.Coarsened.schedule_py): units in order of instance root (a
     * topological order), each one level after the deepest unit it reads, except the units
     * near the sinks (run._defer), which run as late as possible; one group per (level,
     * pattern) and one batch per (level, signature) of the nodes left op-level */
    kept_inst = malloc(sizeof(Py_ssize_t) * span); uindex = malloc(sizeof(Py_ssize_t) * span);
    bcache = malloc(ncache > 0 ? ncache : 1);
    Py_ssize_t maxu = c.np_ + 1, nu = 0, ne = 0, ecap = 0;
    groups = malloc(sizeof(Group) * maxu);
    ugroup = malloc(sizeof(Py_ssize_t) * maxu); upay = malloc(sizeof(Py_ssize_t) * maxu);
    ulv = malloc(sizeof(Py_ssize_t) * maxu); ukind = malloc(sizeof(Py_ssize_t) * maxu);
    utag = malloc(sizeof(Py_ssize_t) * maxu); ufirst = malloc(sizeof(Py_ssize_t) * maxu);
    uheight = malloc(sizeof(Py_ssize_t) * maxu); udefer = malloc(maxu);
    for (Py_ssize_t i = 0; i < ninst; i++) if (pkept[ipat[i]] >= 0) ecap += eoff[i + 1] - eoff[i];
    for (Py_ssize_t k = 0; k < span; k++)
        if (c.ispend[k]) ecap += PyTuple_GET_SIZE(PyList_GET_ITEM(args, k + lo));
    efrom = malloc(sizeof(Py_ssize_t) * (ecap + 1)); eto = malloc(sizeof(Py_ssize_t) * (ecap + 1));
    Py_ssize_t gcap = 16;
    while (gcap < 2 * c.np_ + 16) gcap <<= 1;
    gtab = malloc(sizeof(Py_ssize_t) * gcap);
    if (!kept_inst || !uindex || !bcache || !groups || !gtab || !ugroup || !upay || !ulv || !ukind || !utag ||
        !ufirst || !uheight || !udefer || !efrom || !eto) { PyErr_NoMemory(); goto done; }
    memset(bcache, -1, ncache > 0 ? ncache : 1);
    for (Py_ssize_t k = 0; k < span; k++) { kept_inst[k] = -1; uindex[k] = -1; }
    for (Py_ssize_t k = 0; k < gcap; k++) gtab[k] = -1;
    for (Py_ssize_t i = 0; i < ninst; i++)
        if (pkept[ipat[i]] >= 0) kept_inst[iroot[i]] = i;
    /* pass 1: the units, their as-soon-as-possible levels and who reads whom */
    for (Py_ssize_t rk = 0; rk < span; rk++) {
        if (!c.ispend[rk] || c.owner[rk] != rk + lo) continue;
        Py_ssize_t i = kept_inst[rk], b = c.start[rk], e = c.start[rk + 1];
        Py_ssize_t single = rk + lo;
        const Py_ssize_t *nodes = &single;
        Py_ssize_t nunits = 1;
        if (i < 0 && e - b >= 2) { nodes = c.mem + b; nunits = e - b; }
        for (Py_ssize_t u = 0; u < nunits; u++) {
            Py_ssize_t n = nodes[u], lv = 0;
            PyObject *an = i >= 0 ? NULL : PyList_GET_ITEM(args, n);
            Py_ssize_t ndeps = i >= 0 ? eoff[i + 1] - eoff[i] : PyTuple_GET_SIZE(an);
            for (Py_ssize_t j = 0; j < ndeps; j++) {
                Py_ssize_t x = i >= 0 ? extbuf[eoff[i] + j] : PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
                Py_ssize_t q = x - lo;
                if (q < 0 || q >= span) continue;
                Py_ssize_t ow = c.owner[q];
                Py_ssize_t at = (ow >= 0 && kept_inst[ow - lo] >= 0) ? ow - lo : q;
                Py_ssize_t v = uindex[at];
                if (v < 0) continue;
                if (ne < ecap) { efrom[ne] = v; eto[ne++] = nu; }
                if (ulv[v] >= lv) lv = ulv[v] + 1;
            }
            if (i >= 0) {
                uindex[rk] = nu; ukind[nu] = 0; utag[nu] = pkept[ipat[i]]; ufirst[nu] = rk + lo; upay[nu] = i;
            } else {
                uindex[n - lo] = nu;
                int bt = batchable_of(ops, n, c.sigv[n - lo], bcache, ncache);
                if (bt < 0) goto done;
                ukind[nu] = bt ? 1 : 2; utag[nu] = bt ? c.sigv[n - lo] : n; ufirst[nu] = n; upay[nu] = n;
            }
            ulv[nu++] = lv;
        }
    }
    if (PyErr_Occurred()) goto done;
    /* pass 2 (run._defer): heights over the readers, in reverse; the deferred units' levels */
    {
        Py_ssize_t *rstart = calloc(nu + 1, sizeof(Py_ssize_t)), *rlist = malloc(sizeof(Py_ssize_t) * (ne + 1));
        Py_ssize_t *rfill = malloc(sizeof(Py_ssize_t) * (nu + 1));
        if (!rstart || !rlist || !rfill) { free(rstart); free(rlist); free(rfill); PyErr_NoMemory(); goto done; }
        for (Py_ssize_t k = 0; k < ne; k++) rstart[efrom[k] + 1]++;
        for (Py_ssize_t u = 0; u < nu; u++) rstart[u + 1] += rstart[u];
        memcpy(rfill, rstart, sizeof(Py_ssize_t) * (nu + 1));
        for (Py_ssize_t k = 0; k < ne; k++) rlist[rfill[efrom[k]]++] = eto[k];
        Py_ssize_t top = 0;
        int any = 0;
        for (Py_ssize_t u = nu - 1; u >= 0; u--) {
            Py_ssize_t b = rstart[u], e = rstart[u + 1], h = 0;
            int all = 1;
            if (b == e) { uheight[u] = 0; udefer[u] = 1; }
            else {
                for (Py_ssize_t t = b; t < e; t++) {
                    if (uheight[rlist[t]] + 1 > h) h = uheight[rlist[t]] + 1;
                    if (!udefer[rlist[t]]) all = 0;
                }
                uheight[u] = h;
                udefer[u] = (char)(h <= DEFER_HEIGHT && all);
            }
            if (udefer[u] && (!any || ulv[u] + uheight[u] > top)) { top = ulv[u] + uheight[u]; any = 1; }
        }
        for (Py_ssize_t u = 0; u < nu; u++) if (udefer[u]) ulv[u] = top - uheight[u];
        free(rstart); free(rlist); free(rfill);
    }
    /* pass 3: the groups, in unit order */
    for (Py_ssize_t u = 0; u < nu; u++) {
        Py_ssize_t g = -1;
        if (ukind[u] != 2) {
            Py_ssize_t key3[3] = {ulv[u], ukind[u], utag[u]};
            size_t h = hash_words(key3, 3) & (size_t)(gcap - 1);
            for (;;) {
                g = gtab[h];
                if (g < 0) break;
                if (groups[g].lv == ulv[u] && groups[g].kind == ukind[u] && groups[g].tag == utag[u]) break;
                h = (h + 1) & (size_t)(gcap - 1);
            }
            if (g < 0) g = gtab[h] = ng;
        }
        if (g < 0 || g == ng) {   /* opened by this unit (an unbatchable node: a batch of its own) */
            g = ng++;
            groups[g].lv = ulv[u]; groups[g].kind = (int)ukind[u]; groups[g].tag = utag[u];
            groups[g].first = ufirst[u]; groups[g].count = 0;
        }
        groups[g].count++;
        ugroup[u] = g;
    }
    /* each group's units in the order they came (CSR by group) */
    order = malloc(sizeof(Py_ssize_t) * (ng + 1));
    gunits = malloc(sizeof(Py_ssize_t) * (nu + 1));
    if (!order || !gunits) { PyErr_NoMemory(); goto done; }
    {
        Py_ssize_t at = 0;
        for (Py_ssize_t g = 0; g < ng; g++) { groups[g].at = at; at += groups[g].count; groups[g].count = 0; }
        for (Py_ssize_t u = 0; u < nu; u++) {
            Group *gr = &groups[ugroup[u]];
            gunits[gr->at + gr->count++] = upay[u];
        }
    }
    for (Py_ssize_t g = 0; g < ng; g++) order[g] = g;
    sort_groups = groups;   /* the GIL is held: no other thread runs this sort */
    qsort(order, ng, sizeof(Py_ssize_t), group_order);
    batches = PyList_New(ng);
    if (!batches) goto done;
    for (Py_ssize_t k = 0; k < ng; k++) {
        Group *g = &groups[order[k]];
        const Py_ssize_t *us = gunits + g->at;
        Py_ssize_t B = g->count;
        PyObject *t;
        if (g->kind != 0) {
            t = Py_BuildValue("(nN)", (Py_ssize_t)-1, ssize_list(us, B));
        } else {
            /* (pattern, (per member position its B nodes, per outside input its B nodes,
             *  per instance its slots)) */
            Py_ssize_t f = pfirst[kfirst[g->tag]], M = c.start[iroot[f] + 1] - c.start[iroot[f]];
            Py_ssize_t E = eoff[f + 1] - eoff[f];
            PyObject *bm = PyTuple_New(M), *be = PyTuple_New(E), *sl = PyTuple_New(B);
            if (!bm || !be || !sl) { Py_XDECREF(bm); Py_XDECREF(be); Py_XDECREF(sl); goto done; }
            int err = 0;
            for (Py_ssize_t m = 0; m < M && !err; m++) {
                PyObject *col = PyTuple_New(B);
                if (!col) { err = 1; break; }
                PyTuple_SET_ITEM(bm, m, col);
                for (Py_ssize_t w = 0; w < B; w++) {
                    PyObject *x = PyLong_FromSsize_t(c.mem[c.start[iroot[us[w]]] + m]);
                    if (!x) { err = 1; break; }
                    PyTuple_SET_ITEM(col, w, x);
                }
            }
            for (Py_ssize_t j = 0; j < E && !err; j++) {
                PyObject *col = PyTuple_New(B);
                if (!col) { err = 1; break; }
                PyTuple_SET_ITEM(be, j, col);
                for (Py_ssize_t w = 0; w < B; w++) {
                    PyObject *x = PyLong_FromSsize_t(extbuf[eoff[us[w]] + j]);
                    if (!x) { err = 1; break; }
                    PyTuple_SET_ITEM(col, w, x);
                }
            }
            for (Py_ssize_t w = 0; w < B && !err; w++) {
                PyObject *x = instance_slots(&c, data, iroot[us[w]]);
                if (!x) { err = 1; break; }
                PyTuple_SET_ITEM(sl, w, x);
            }
            if (err) { Py_DECREF(bm); Py_DECREF(be); Py_DECREF(sl); goto done; }
            t = Py_BuildValue("(n(NNN))", g->tag, bm, be, sl);
        }
        if (!t) goto done;
        PyList_SET_ITEM(batches, k, t);
    }
    result = PyTuple_Pack(2, pats, batches);
done:
    Py_XDECREF(pats); Py_XDECREF(batches);
    free(pos); free(keybuf); free(extbuf); free(koff); free(eoff); free(iroot); free(ipat); free(iw);
    free(pfirst); free(pcount); free(pkept); free(kfirst); free(ptab);
    free(kept_inst); free(uindex); free(bcache); free(groups); free(gtab); free(order);
    free(ulv); free(ukind); free(utag); free(ufirst); free(uheight); free(udefer); free(efrom); free(eto);
    free(ugroup); free(upay); free(gunits);
    cut_free(&c);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, "find(args, sig, ops, data, pending, max_nodes, max_args, n_signatures)"},
    {"plan", plan, METH_VARARGS,
     "plan(args, sig, ops, data, pending, max_nodes, max_args, n_signatures, min_calls, defer_height)"
     " -> (patterns, batches)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_coarsen", "automatic coarsening's per-node pass",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__coarsen(void) { return PyModule_Create(&module); }
