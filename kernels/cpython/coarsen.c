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
#include "coarsen.h"

int dgc_op_flag(PyObject *op, const char *name) {
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
    int leaf = dgc_op_flag(op, "leaf"), batchable = dgc_op_flag(op, "batchable"), saves = dgc_op_flag(op, "saves_ctx");
    int ud = dgc_op_flag(op, "uses_data");
    if (leaf < 0 || batchable < 0 || saves < 0 || ud < 0) return -1;
    int ok = nargs > 0 && nargs <= max_args && !leaf && batchable && !saves;
    if (ok && !ud) {
        int all_leaf = 1;
        for (Py_ssize_t i = 0; i < nargs; i++) {
            Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(args_n, i));
            if (a < 0 || a >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); return -1; }
            int l = dgc_op_flag(PyList_GET_ITEM(ops, a), "leaf");
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


/* whether the instance rooted at lo + rk already holds a member with signature sg (by_shape 0)
 * or with one-level hash sg (by_shape 1): a walk over its members, which lie close together */
static int holds(const Cut *c, Py_ssize_t rk, Py_ssize_t sg, int by_shape) {
    const Py_ssize_t *v = by_shape ? c->shape : c->sigv;
    for (Py_ssize_t k = c->head[rk]; k >= 0; k = c->next_in[k])
        if (v[k] == sg) return 1;
    return 0;
}

void dgc_cut_free(Cut *c) {
    free(c->owner); free(c->cmin); free(c->size); free(c->sigv); free(c->csig); free(c->start); free(c->mem);
    free(c->shape1); free(c->shape); free(c->head); free(c->next_in); free(c->repeated.slots);
    free(c->ispend); free(c->cmulti); free(c->excl); free(c->cache); free(c->uses);
}

/* The Cut's arrays for pending ids lo..hi; 0 on success, -1 with an exception set. */
static int cut_alloc(Cut *c, PyObject *sig, PyObject *pending, Py_ssize_t lo, Py_ssize_t hi) {
    Py_ssize_t span = hi - lo + 1, sz = sizeof(Py_ssize_t), nc = c->ncache > 0 ? c->ncache : 1;
    c->lo = lo; c->span = span;
    c->owner = malloc(sz * span); c->cmin = malloc(sz * span); c->size = calloc(span, sz);
    c->sigv = malloc(sz * span); c->csig = malloc(sz * span);   /* signature of the last-recorded consumer */
    c->ispend = calloc(span, 1); c->cmulti = calloc(span, 1); c->excl = calloc(span, 1);
    c->cache = malloc(nc); c->uses = malloc(nc);
    c->shape1 = malloc(sz * span); c->shape = malloc(sz * span); c->head = malloc(sz * span);
    c->next_in = malloc(sz * span);
    if (!c->owner || !c->cmin || !c->size || !c->sigv || !c->csig || !c->ispend || !c->cmulti || !c->excl ||
        !c->cache || !c->uses || !c->shape1 || !c->shape || !c->head || !c->next_in) {
        PyErr_NoMemory();
        return -1;
    }
    memset(c->cache, -1, nc);
    memset(c->uses, 0, nc);
    for (Py_ssize_t i = 0; i < span; i++) { c->owner[i] = -1; c->cmin[i] = -1; c->csig[i] = -1; c->head[i] = -1; }
    for (Py_ssize_t i = 0; i < c->np_; i++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i));
        if (n < lo || n > hi) { PyErr_SetString(PyExc_IndexError, "pending ids not ascending"); return -1; }
        c->ispend[n - lo] = 1;
        c->sigv[n - lo] = PyLong_AsSsize_t(PyList_GET_ITEM(sig, n));
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* Node n's two-level hash (detect._shape2), from the one-level hashes of its arguments. */
static int two_level(Cut *c, PyObject *args, PyObject *sig, PyObject *an, Py_ssize_t k, Py_ssize_t *out) {
    unsigned long long hmask = (1ull << 62) - 1, hs = (unsigned long long)(c->shape1[k] + 2);
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(an); j++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)), sx, q = x - c->lo;
        if (x < 0 || x >= c->nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); return -1; }
        if (q >= 0 && q < c->span && c->ispend[q]) sx = c->shape1[q];
        else if (one_level(args, sig, x, c->nnodes, &sx) < 0) return -1;
        hs = (hs * 1000003ull + (unsigned long long)(sx + 2)) & hmask;
    }
    *out = (Py_ssize_t)hs;
    return 0;
}

/* The instance root of coarsenable node n (span index k), per the rules in detect.py's doc;
 * -1 with an exception set. */
static Py_ssize_t root_of(Cut *c, Py_ssize_t n, Py_ssize_t k, Py_ssize_t max_nodes, int inner) {
    Py_ssize_t lo = c->lo, m = c->cmin[k], sg = c->sigv[k], shape_k = c->shape[k];
    int rep = shapes_has(&c->repeated, shape_k);
    if (m < 0 || c->excl[m - lo] || c->size[m - lo] >= max_nodes || rep) return n;
    if (!c->cmulti[k]) {
        /* shaped like a member, or read like the root: the previous repetition */
        int cut = holds(c, m - lo, shape_k, 1) ||
                  (sg == c->sigv[m - lo] && c->csig[m - lo] >= 0 && c->csig[m - lo] == c->csig[k]);
        if (cut && shapes_add(&c->repeated, shape_k) < 0) return -1;
        return cut ? n : m;
    }
    if (!inner) return n;   /* an input read by several instances (a word's embedding): op-level, level 0 */
    if (!holds(c, m - lo, sg, 0)) return m;
    /* shaped like a member of the next repetition too: a repetition output */
    if (holds(c, m - lo, shape_k, 1) && shapes_add(&c->repeated, shape_k) < 0) return -1;
    return n;
}

/* members per instance, in id order: count, then fill (CSR by root) */
static int members_csr(Cut *c) {
    Py_ssize_t span = c->span, lo = c->lo, sz = sizeof(Py_ssize_t);
    c->start = calloc(span + 1, sz);
    if (!c->start) { PyErr_NoMemory(); return -1; }
    Py_ssize_t *start = c->start;
    for (Py_ssize_t k = 0; k < span; k++)
        if (c->ispend[k] && !c->excl[k] && c->size[c->owner[k] - lo] > 1) start[c->owner[k] - lo + 1]++;
    for (Py_ssize_t k = 0; k < span; k++) start[k + 1] += start[k];
    Py_ssize_t *fill = malloc(sz * (span + 1));
    c->mem = malloc(sz * (start[span] + 1));
    if (!fill || !c->mem) { free(fill); PyErr_NoMemory(); return -1; }
    memcpy(fill, start, sz * (span + 1));
    for (Py_ssize_t k = 0; k < span; k++)
        if (c->ispend[k] && !c->excl[k] && c->size[c->owner[k] - lo] > 1) c->mem[fill[c->owner[k] - lo]++] = k + lo;
    free(fill);
    return 0;
}

/* 0 on success (the Cut filled; free it with dgc_cut_free either way), -1 with an exception set. */
int dgc_cut_nodes(Cut *c, PyObject *args, PyObject *sig, PyObject *ops, PyObject *data, PyObject *pending,
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
    if (cut_alloc(c, sig, pending, lo, hi) < 0) return -1;
    for (Py_ssize_t i = 0; i < np_; i++) {   /* one level of structure per pending node */
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i));
        if (one_level(args, sig, n, nnodes, &c->shape1[n - lo]) < 0) return -1;
    }
    for (Py_ssize_t i = np_ - 1; i >= 0; i--) {   /* consumers before producers */
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i)), k = n - lo, r = n;
        PyObject *an = PyList_GET_ITEM(args, n);
        Py_ssize_t nargs = PyTuple_GET_SIZE(an), sg = c->sigv[k];
        int ok = can_join(ops, an, nargs, n, sg, c->cache, ncache, max_args, nnodes, c->uses);
        if (ok < 0 || two_level(c, args, sig, an, k, &c->shape[k]) < 0) return -1;
        if (!ok) {
            c->excl[k] = 1;
            c->owner[k] = n;
        } else {
            int inner = 0;   /* reads a node of this chunk */
            for (Py_ssize_t j = 0; j < nargs && !inner; j++) {
                Py_ssize_t q = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)) - lo;
                inner = q >= 0 && q < c->span && c->ispend[q];
            }
            if ((r = root_of(c, n, k, max_nodes, inner)) < 0) return -1;
            c->owner[k] = r;
            c->size[r - lo] += 1;
            c->next_in[k] = c->head[r - lo];
            c->head[r - lo] = k;
        }
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t q = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)) - lo;
            if (q >= 0 && q < c->span && c->ispend[q]) {
                if (c->csig[q] < 0) c->csig[q] = sg;
                if (c->cmin[q] < 0) c->cmin[q] = r;
                else if (c->cmin[q] != r) { c->cmulti[q] = 1; if (r < c->cmin[q]) c->cmin[q] = r; }
            }
        }
    }
    if (PyErr_Occurred()) return -1;
    return members_csr(c);
}

/* The canonical key of the instance rooted at lo + rk (members mem[b..e)) into key[] (sig,
 * nargs, refs per member) and its outside arguments into ext[] in first-use order; returns
 * the key's length and sets *next to the number of outside arguments. pos[] (span entries,
 * all -1) is scratch and left all -1. */
Py_ssize_t dgc_instance_key(const Cut *c, PyObject *args, Py_ssize_t rk, Py_ssize_t *pos, Py_ssize_t *key,
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
PyObject *dgc_instance_slots(const Cut *c, PyObject *data, Py_ssize_t rk) {
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

PyObject *dgc_ssize_list(const Py_ssize_t *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);
        if (!x) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

PyObject *dgc_ssize_tuple(const Py_ssize_t *v, Py_ssize_t n) {
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
    if (dgc_cut_nodes(&c, args, sig, ops, data, pending, max_nodes, max_args, ncache) < 0) goto done;
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
        Py_ssize_t nkey = dgc_instance_key(&c, args, rk, pos, key, ext, &next);
        if (PyErr_Occurred()) goto done;
        PyObject *item = Py_BuildValue("(nNNNN)", rk + lo, dgc_ssize_list(c.mem + b, e - b), dgc_ssize_tuple(key, nkey),
                                       dgc_ssize_list(ext, next), dgc_instance_slots(&c, data, rk));
        if (!item || PyList_Append(out, item) < 0) { Py_XDECREF(item); goto done; }
        Py_DECREF(item);
    }
    owner_list = dgc_ssize_list(c.owner, span);
    if (owner_list) result = PyTuple_Pack(2, owner_list, out);
done:
    Py_XDECREF(owner_list);
    Py_XDECREF(out);
    free(pos); free(key); free(ext);
    dgc_cut_free(&c);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, "find(args, sig, ops, data, pending, max_nodes, max_args, n_signatures)"},
    {"plan", dgc_plan, METH_VARARGS,
     "plan(args, sig, ops, data, pending, max_nodes, max_args, n_signatures, min_calls, defer_height)"
     " -> (patterns, batches)"},
    {"block_configure", dgc_block_configure, METH_VARARGS, "block_configure(Expression, current, BLOCK_OUTPUT)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_coarsen", "automatic coarsening's per-node pass; dy.block's call path",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__coarsen(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && dgc_block_type_ready(m) < 0) Py_CLEAR(m);
    return m;
}
