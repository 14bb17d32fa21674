/* Signature caches of the recorder (part of dynagraph._bookkeeping; see recorder.c).

A node's signature (op, attrs, its arguments' parts) is looked up once per recorded node.
  per graph    SIG_CACHE entries by identity in sets of SIG_WAYS (GraphObject.cache), from the graph's
               sig_id dict: dg_sig_cache_get / dg_sig_cache_put / dg_sig_cache_clear
  all graphs   GLOBAL_SIGS entries (dg_global_get / dg_global_put): a signature an earlier
               graph met is registered in a new graph without building or hashing its key
Attrs compare by value for exact ints and floats and by identity otherwise (attrs_match),
and both caches hash them the same way (attrs_hash). */
#include "recorder.h"

#include <string.h>

static PyObject *CheckName = NULL, *BlocksGradName = NULL;  /* "check", "blocks_grad" */

static void sig_entry_clear(SigEntry *e) {
    Py_CLEAR(e->op);
    Py_CLEAR(e->attrs);
    Py_CLEAR(e->known);
    for (int k = 0; k < SIG_CACHE_ARGS; k++)
        Py_CLEAR(e->parts[k]);
    e->n = 0;
}

void dg_sig_cache_clear(GraphObject *g) {
    if (g->cache)
        for (int k = 0; k < g->nused; k++)
            sig_entry_clear(&g->cache[g->used[k]]);
    g->nused = 0;
    Py_CLEAR(g->cache_of);
}

/* One cleared cache kept from the last graph freed: renew_cg() then costs no allocation and
   no zeroing of SIG_CACHE entries for the next graph. */
static SigEntry *SpareCache = NULL;

void dg_sig_cache_free(GraphObject *g) {
    if (g->cache && !SpareCache)
        SpareCache = g->cache;  /* cleared by graph_clear */
    else
        PyMem_Free(g->cache);
    g->cache = NULL;
}

/* A hash of attrs consistent with attrs_match: exact ints and floats by value (a gate's
   pick_range attrs are a new tuple per call, and the gates of one cell differ only there),
   anything else by identity. Without it every slice of one argument shared a cache slot. */
static size_t attrs_hash(PyObject *attrs) {
    if (!PyTuple_CheckExact(attrs))
        return (size_t)attrs >> 4;
    size_t h = (size_t)PyTuple_GET_SIZE(attrs);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(attrs); k++) {
        PyObject *a = PyTuple_GET_ITEM(attrs, k);
        size_t v;
        if (PyLong_CheckExact(a)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(a, &overflow);
            v = overflow ? 0 : (size_t)x;
        } else if (PyFloat_CheckExact(a)) {
            double d = PyFloat_AS_DOUBLE(a);
            if (d == 0.0)
                d = 0.0;  /* -0.0 == 0.0 */
            memcpy(&v, &d, sizeof(v) < sizeof(d) ? sizeof(v) : sizeof(d));
        } else {
            v = (size_t)a >> 4;
        }
        h = (h * 1000003u) ^ v;
    }
    return h;
}

/* The cache is 4-way set associative, newest first in each set; a new entry drops the oldest.
   It was direct-mapped on addresses: in some runs two of a program's two dozen signatures
   shared a slot, evicted each other at every node and sent each such node to dg_global_get
   (29,800 calls in three TreeLSTM inference steps at H=64 against 161: about 5% of the steps'
   instructions). Four ways need five signatures in one of 64 sets for that. Moving a hit to
   the front of its set (LRU) cost 0.5% more instructions than it saved there. */
enum { SIG_WAYS = 4 };

/* The first entry of the set of (op, attrs, parts). */
static size_t sig_set(PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n) {
    size_t h = ((size_t)op >> 4) ^ (attrs_hash(attrs) * 0x9E3779B97F4A7C15ull);
    for (Py_ssize_t k = 0; k < n; k++)
        h = h * 1000003u ^ ((size_t)parts[k] >> 4);
    return (h ^ (h >> 11)) % (SIG_CACHE / SIG_WAYS) * SIG_WAYS;
}

/* Whether attrs tuples a (cached) and b are equal, as the signature dict would find them:
   equal values share a signature. Only exact ints and floats are compared here; anything
   else that is not the same object is "no" (the caller then takes the dict). */
static int attrs_match(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b))
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(a); k++) {
        PyObject *x = PyTuple_GET_ITEM(a, k), *y = PyTuple_GET_ITEM(b, k);
        if (x == y)
            continue;
        if (!(PyLong_CheckExact(x) && PyLong_CheckExact(y)) && !(PyFloat_CheckExact(x) && PyFloat_CheckExact(y)))
            return 0;
        int eq = PyObject_RichCompareBool(x, y, Py_EQ);
        if (eq != 1) {
            if (eq < 0)
                PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Whether entry e holds (op, attrs, parts). */
static int sig_entry_is(const SigEntry *e, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n) {
    if (e->n != n || e->op != op || !e->known)
        return 0;
    for (Py_ssize_t k = 0; k < n; k++)
        if (e->parts[k] != parts[k])
            return 0;
    return attrs_match(e->attrs, attrs);
}

/* The cached `known` tuple for (op, attrs, parts), or NULL (borrowed). */
PyObject *dg_sig_cache_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n) {
    if (!g->cache || g->cache_of != g->sig_id || n > SIG_CACHE_ARGS)
        return NULL;
    SigEntry *set = &g->cache[sig_set(op, attrs, parts, n)];
    for (int w = 0; w < SIG_WAYS; w++)
        if (sig_entry_is(&set[w], op, attrs, parts, n))
            return set[w].known;
    return NULL;
}

void dg_sig_cache_put(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n,
                          PyObject *known) {
    if (n > SIG_CACHE_ARGS)
        return;
    if (!g->cache) {
        if (SpareCache) {
            g->cache = SpareCache;
            SpareCache = NULL;
        } else if (!(g->cache = PyMem_Calloc(SIG_CACHE, sizeof(SigEntry)))) {
            return;  /* no cache: every lookup takes the dict */
        }
        g->nused = 0;
    }
    if (g->cache_of != g->sig_id) {  /* sig_id was replaced: nothing cached still holds */
        dg_sig_cache_clear(g);
        Py_INCREF(g->sig_id);
        g->cache_of = g->sig_id;
    }
    /* the new entry goes first and the oldest (or an empty way) drops off: a
       set's filled ways are always its first ones, so each slot is listed in used once */
    size_t first = sig_set(op, attrs, parts, n);
    SigEntry *set = &g->cache[first], dropped = set[SIG_WAYS - 1];
    if (!dropped.op) {
        int w = 0;
        while (set[w].op)
            w++;
        g->used[g->nused++] = (unsigned short)(first + (size_t)w);
    }
    memmove(&set[1], &set[0], (SIG_WAYS - 1) * sizeof(SigEntry));
    memset(&set[0], 0, sizeof(SigEntry));
    SigEntry *e = &set[0];
    Py_INCREF(op);
    Py_INCREF(attrs);
    Py_INCREF(known);
    e->op = op;
    e->attrs = attrs;
    e->known = known;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_INCREF(parts[k]);
        e->parts[k] = parts[k];
    }
    e->n = n;
    sig_entry_clear(&dropped);  /* last: freeing its references may run code */
}


/* ------------------------------------------------------ signatures across graphs */
/* A per-sentence program builds the same dozen signatures in every graph: each graph meets
   each of them once, and registering it (the key tuple built and hashed, the shared shape
   cache's key built and hashed, the op's check read) was a third of recording a sentence.
   This cache, shared by every graph, remembers by identity what a signature is made of:
   the op, equal attrs, the arguments' parts and their shapes (a parameter's part does not
   determine its shape: its storage may be replaced), and gives the key tuple, the output
   shape and the interned attrs. A graph meeting such a signature registers it exactly as
   _new_signature does, reading check and blocks_grad from the op as that does. Entries hold
   references, so no address they compare against can be reused. */
enum { GLOBAL_SIGS = 1024 };
typedef struct {
    PyObject *op, *attrs, *key, *shape, *parts[SIG_CACHE_ARGS], *shapes[SIG_CACHE_ARGS];
    Py_ssize_t n;
    Py_hash_t hash;  /* the key's: registering it in a graph's sig_id does not hash it again */
} GlobalSig;

/* sig_id.setdefault(key, made) (borrowed result) with the key's hash known, where CPython
   exports the known-hash dict calls (hashing a nested key tuple was most of a registration). */
static PyObject *setdefault_known(PyObject *dict, PyObject *key, PyObject *made, Py_hash_t hash) {
#if PY_VERSION_HEX < 0x030D0000
    PyObject *found = _PyDict_GetItem_KnownHash(dict, key, hash);
    if (found || PyErr_Occurred())
        return found;
    return _PyDict_SetItem_KnownHash(dict, key, made, hash) < 0 ? NULL : made;
#else
    (void)hash;
    return PyDict_SetDefault(dict, key, made);
#endif
}
static GlobalSig *GlobalSigs = NULL;

static size_t global_slot(PyObject *op, PyObject *attrs, PyObject *const *parts, PyObject *const *shapes,
                          Py_ssize_t n) {
    size_t h = ((size_t)op >> 4) ^ (attrs_hash(attrs) * 0x9E3779B97F4A7C15ull);
    for (Py_ssize_t k = 0; k < n; k++)
        h = (h * 1000003u ^ ((size_t)parts[k] >> 4)) * 31u ^ ((size_t)shapes[k] >> 4);
    return (h ^ (h >> 13)) % GLOBAL_SIGS;
}

/* The argument shapes (borrowed) of ids, the first SIG_CACHE_ARGS. */
void dg_arg_shapes(GraphObject *g, PyObject *ids, PyObject **shapes) {
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    for (Py_ssize_t k = 0; k < n && k < SIG_CACHE_ARGS; k++)
        shapes[k] = PyList_GET_ITEM(g->shape, PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k)));  /* checked */
}

void dg_global_put(PyObject *op, PyObject *attrs, PyObject *const *parts, PyObject *const *shapes,
                       Py_ssize_t n, PyObject *key, PyObject *known) {
    if (n > SIG_CACHE_ARGS || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 5)
        return;
    if (!GlobalSigs && !(GlobalSigs = PyMem_Calloc(GLOBAL_SIGS, sizeof(GlobalSig))))
        return;
    Py_INCREF(known);  /* borrowed from sig_id, and hashing attrs might run code */
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1 || Py_REFCNT(known) == 1) {  /* no hash, or sig_id let go of it meanwhile */
        PyErr_Clear();
        Py_DECREF(known);
        return;
    }
    Py_DECREF(known);
    GlobalSig *e = &GlobalSigs[global_slot(op, attrs, parts, shapes, n)];
    PyObject *old[4 + 2 * SIG_CACHE_ARGS];  /* released last: a decref may run Python code */
    int nold = 0;
    old[nold++] = e->op;
    old[nold++] = e->attrs;
    old[nold++] = e->key;
    old[nold++] = e->shape;
    for (Py_ssize_t k = 0; k < e->n; k++) {
        old[nold++] = e->parts[k];
        old[nold++] = e->shapes[k];
    }
    e->hash = hash;
    e->op = Py_NewRef(op);
    e->attrs = Py_NewRef(PyTuple_GET_ITEM(known, 2));
    e->key = Py_NewRef(key);
    e->shape = Py_NewRef(PyTuple_GET_ITEM(known, 1));
    for (Py_ssize_t k = 0; k < n; k++) {
        e->parts[k] = Py_NewRef(parts[k]);
        e->shapes[k] = Py_NewRef(shapes[k]);
    }
    e->n = n;
    for (int k = 0; k < nold; k++)
        Py_XDECREF(old[k]);
}

/* The signature's `known` tuple in g (borrowed) when the shared cache knows it, registered
   in g if it is new there; NULL without an error when the cache does not know it, NULL with
   an error (*failed = 1) on failure. */
PyObject *dg_global_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts,
                            PyObject *const *shapes, Py_ssize_t n, int *failed) {
    *failed = 0;
    if (!GlobalSigs || n > SIG_CACHE_ARGS || !g->signatures || !PyList_CheckExact(g->signatures))
        return NULL;
    GlobalSig *e = &GlobalSigs[global_slot(op, attrs, parts, shapes, n)];
    if (!e->key || e->n != n || e->op != op)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        if (e->parts[k] != parts[k] || e->shapes[k] != shapes[k])
            return NULL;
    if (!attrs_match(e->attrs, attrs))
        return NULL;
    PyObject *key = Py_NewRef(e->key), *shape = Py_NewRef(e->shape), *iattrs = Py_NewRef(e->attrs);
    /* check and blocks_grad as the op has them now, as _new_signature reads them */
    if ((!CheckName && !(CheckName = PyUnicode_InternFromString("check"))) ||
        (!BlocksGradName && !(BlocksGradName = PyUnicode_InternFromString("blocks_grad")))) {
        Py_DECREF(key);
        Py_DECREF(shape);
        Py_DECREF(iattrs);
        *failed = 1;
        return NULL;
    }
    PyObject *check = PyObject_GetAttr(op, CheckName);
    PyObject *blocks = check ? PyObject_GetAttr(op, BlocksGradName) : NULL;
    PyObject *sid = blocks ? PyLong_FromSsize_t(PyList_GET_SIZE(g->signatures)) : NULL;
    PyObject *made = sid ? PyTuple_Pack(5, sid, shape, iattrs, check, blocks) : NULL;
    PyObject *known = made ? setdefault_known(g->sig_id, key, made, e->hash) : NULL;  /* borrowed */
    if (known == made && made && PyList_Append(g->signatures, key) < 0)
        known = NULL;  /* (sig_id then names a signature id past the list: Python's add() would too) */
    Py_XDECREF(made);
    Py_XDECREF(sid);
    Py_XDECREF(check);
    Py_XDECREF(blocks);
    Py_DECREF(key);
    Py_DECREF(shape);
    Py_DECREF(iattrs);
    if (!known)
        *failed = 1;
    return known;
}
