/* The recording hot path (part of dynagraph._bookkeeping; see bookkeeping.h).

Recording a node is pure bookkeeping (a signature lookup and nine list appends), yet in
Python it cost about 0.5 us, half of a TreeLSTM training step at H=64.

It holds no logic Python does not also have: ComputationGraph._add_py (graph.py) is
the reference for `add`, and whenever the fast path meets anything unusual (a signature
not seen yet, a failing check, an index slot, immediate_compute, odd argument types) it
hands the whole call to Python before touching any list. So errors and rare cases have
exactly one implementation.

Types (ExprBase and Recorder live in expr_recorder.c):
  GraphBase   base class of ComputationGraph: the node columns as C fields, and add()
*/
#include "recorder.h"
#include <structmember.h>

/* ------------------------------------------------------------------ GraphBase */

static void sig_entry_clear(SigEntry *e) {
    Py_CLEAR(e->op);
    Py_CLEAR(e->attrs);
    Py_CLEAR(e->known);
    for (int k = 0; k < SIG_CACHE_ARGS; k++)
        Py_CLEAR(e->parts[k]);
    e->n = 0;
}

static void sig_cache_clear(GraphObject *g) {
    if (g->cache)
        for (int k = 0; k < g->nused; k++)
            sig_entry_clear(&g->cache[g->used[k]]);
    g->nused = 0;
    Py_CLEAR(g->cache_of);
}

/* One cleared cache kept from the last graph freed: renew_cg() then costs no allocation and
   no zeroing of SIG_CACHE entries for the next graph. */
static SigEntry *SpareCache = NULL;

static PyObject *IndexSlotType = NULL;
static PyObject *RandomKey = NULL;
static PyObject *AddPyName = NULL;     /* "_add_py" */
static PyObject *CheckName = NULL, *BlocksGradName = NULL;  /* "check", "blocks_grad" */
/* dict shared by every graph: (op, attrs, argument shapes) -> output shape.
   A shape rule is a function of exactly those, so a graph meeting a signature for the first
   time (every signature of every graph after renew_cg) takes its shape from here instead of
   running the rule in Python. Values are output shapes. Filled by
   ComputationGraph._new_signature only; read here. */
static PyObject *ShapeCache = NULL;

#define N_COLUMNS 17
static PyObject **graph_column(GraphObject *g, int k) {
    PyObject **cols[N_COLUMNS] = {&g->op, &g->args, &g->attrs, &g->data, &g->shape, &g->depth,
                                  &g->sig, &g->sig_part, &g->needs_grad, &g->sig_id, &g->rand_base,
                                  &g->signatures, &g->leaves, &g->blk, &g->row, &g->blocks,
                                  &g->block_param};
    return cols[k];
}

static int graph_traverse(GraphObject *g, visitproc visit, void *arg) {
    for (int k = 0; k < N_COLUMNS; k++)
        Py_VISIT(*graph_column(g, k));
    Py_VISIT(g->cache_of);
    for (int k = 0; g->cache && k < g->nused; k++) {
        SigEntry *e = &g->cache[g->used[k]];
        Py_VISIT(e->op);
        Py_VISIT(e->attrs);
        Py_VISIT(e->known);
        for (int k = 0; k < SIG_CACHE_ARGS; k++)
            Py_VISIT(e->parts[k]);
    }
    return 0;
}

/* Emptied column lists of freed graphs, kept with their storage: a per-sentence program
   makes a graph of a few dozen nodes per sentence, and growing a dozen fresh lists to that
   size (a realloc every few appends) cost as much as recording the nodes. One pool per
   column, so each list keeps serving the column it grew for (the storage kept stays that of
   the graphs the program makes, it does not creep); a few per column (the next graph is
   made before the last one is freed), small lists only (a large graph's appends are
   amortised anyway), and only when the graph held the last reference to the list. */
enum { LIST_POOL = 2, LIST_POOL_MAX_ITEMS = 4096, N_LIST_COLUMNS = 13 };
static PyObject *ListPool[N_LIST_COLUMNS][LIST_POOL];
static int ListPoolSize[N_LIST_COLUMNS];

static void pool_list(int column, PyObject *l) {
    if (ListPoolSize[column] == LIST_POOL || !PyList_CheckExact(l) || Py_REFCNT(l) != 1 ||
        ((PyListObject *)l)->allocated > LIST_POOL_MAX_ITEMS) {
        Py_DECREF(l);
        return;
    }
    /* nothing else can reach l: empty it first, then release the items (which may run code) */
    PyObject **items = ((PyListObject *)l)->ob_item;
    Py_ssize_t n = Py_SIZE(l);
    Py_SET_SIZE(l, 0);
    for (Py_ssize_t k = 0; k < n; k++)
        Py_DECREF(items[k]);
    if (ListPoolSize[column] < LIST_POOL && Py_REFCNT(l) == 1 && Py_SIZE(l) == 0 &&
        ((PyListObject *)l)->ob_item == items)
        ListPool[column][ListPoolSize[column]++] = l;
    else
        Py_DECREF(l);
}

static PyObject *pooled_list(int column) {
    return ListPoolSize[column] ? ListPool[column][--ListPoolSize[column]] : PyList_New(0);
}

/* The columns that are lists, whose storage pool_list keeps. */
static PyObject **list_column(GraphObject *g, int k) {
    PyObject **cols[N_LIST_COLUMNS] = {&g->op, &g->args, &g->attrs, &g->data, &g->shape, &g->depth, &g->sig,
                                       &g->sig_part, &g->needs_grad, &g->blk, &g->row, &g->blocks,
                                       &g->signatures};
    return cols[k];
}

static int graph_clear(GraphObject *g) {
    for (int k = 0; k < N_LIST_COLUMNS; k++) {
        PyObject *l = *list_column(g, k);
        *list_column(g, k) = NULL;
        if (l)
            pool_list(k, l);
    }
    for (int k = 0; k < N_COLUMNS; k++)
        Py_CLEAR(*graph_column(g, k));
    sig_cache_clear(g);
    return 0;
}

/* _start(): a new graph's empty columns (lists kept from freed graphs where there are). */
static PyObject *graph_start(GraphObject *g, PyObject *unused) {
    (void)unused;
    for (int k = 0; k < N_LIST_COLUMNS; k++) {
        PyObject *l = pooled_list(k);
        if (!l)
            return NULL;
        Py_XSETREF(*list_column(g, k), l);
    }
    PyObject **dicts[3] = {&g->sig_id, &g->leaves, &g->block_param};
    for (int k = 0; k < 3; k++) {
        PyObject *d = PyDict_New();
        if (!d)
            return NULL;
        Py_XSETREF(*dicts[k], d);
    }
    Py_RETURN_NONE;
}

/* _rand_base: the first node id's random key, drawn (RandDraw()) when a graph first needs it:
   most graphs record no random op, and a draw from the seeded stream cost a quarter of
   renew_cg(). */
static PyObject *RandDraw = NULL;

static PyObject *rand_base_of(GraphObject *g) {
    if (!g->rand_base) {
        if (!RandDraw) {
            PyErr_SetString(PyExc_RuntimeError, "configure() was not given the random key draw");
            return NULL;
        }
        PyObject *v = PyObject_CallNoArgs(RandDraw);
        if (!v)
            return NULL;
        if (g->rand_base)  /* the draw ran Python code that set it */
            Py_DECREF(v);
        else
            g->rand_base = v;
    }
    return g->rand_base;  /* borrowed */
}

static PyObject *graph_get_rand_base(GraphObject *g, void *closure) {
    (void)closure;
    return Py_XNewRef(rand_base_of(g));
}

static int graph_set_rand_base(GraphObject *g, PyObject *v, void *closure) {
    (void)closure;
    Py_XINCREF(v);
    Py_XSETREF(g->rand_base, v);
    return 0;
}

static void graph_dealloc(GraphObject *g) {
    PyObject_GC_UnTrack(g);
    graph_clear(g);
    if (g->cache && !SpareCache)
        SpareCache = g->cache;  /* cleared by graph_clear */
    else
        PyMem_Free(g->cache);
    g->cache = NULL;
    Py_TYPE(g)->tp_free((PyObject *)g);
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

static size_t sig_slot(PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n) {
    size_t h = ((size_t)op >> 4) ^ (attrs_hash(attrs) * 0x9E3779B97F4A7C15ull);
    for (Py_ssize_t k = 0; k < n; k++)
        h = h * 1000003u ^ ((size_t)parts[k] >> 4);
    return (h ^ (h >> 11)) % SIG_CACHE;
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

/* The cached `known` tuple for (op, attrs, parts), or NULL (borrowed). */
static PyObject *sig_cache_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n) {
    if (!g->cache || g->cache_of != g->sig_id || n > SIG_CACHE_ARGS)
        return NULL;
    SigEntry *e = &g->cache[sig_slot(op, attrs, parts, n)];
    if (e->n != n || e->op != op || !e->known)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        if (e->parts[k] != parts[k])
            return NULL;
    if (!attrs_match(e->attrs, attrs))
        return NULL;
    return e->known;
}

static void sig_cache_put(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts, Py_ssize_t n,
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
        sig_cache_clear(g);
        Py_INCREF(g->sig_id);
        g->cache_of = g->sig_id;
    }
    size_t slot = sig_slot(op, attrs, parts, n);
    SigEntry *e = &g->cache[slot];
    if (!e->op)
        g->used[g->nused++] = (unsigned short)slot;  /* each slot at most once: it stays filled */
    sig_entry_clear(e);
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
static void arg_shapes(GraphObject *g, PyObject *ids, PyObject **shapes) {
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    for (Py_ssize_t k = 0; k < n && k < SIG_CACHE_ARGS; k++)
        shapes[k] = PyList_GET_ITEM(g->shape, PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k)));  /* checked */
}

static void global_put(PyObject *op, PyObject *attrs, PyObject *const *parts, PyObject *const *shapes,
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
static PyObject *global_get(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *const *parts,
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

/* The slow path: ComputationGraph._add_py(op, ids, attrs, data). */
static PyObject *add_in_python(GraphObject *g, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data) {
    PyObject *argv[5] = {(PyObject *)g, op, ids, attrs, data};
    return PyObject_VectorcallMethod(AddPyName, argv, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* Column k of the graph if it is a list (anything else: let Python deal with it). */
#define LIST_OR_SLOW(x) do { if (!(x) || !PyList_CheckExact(x)) return 0; } while (0)

/* Index i of a node argument, or -1 if it is not a valid node id. */
static Py_ssize_t node_index(PyObject *v, Py_ssize_t n) {
    if (!PyLong_CheckExact(v))
        return -1;
    Py_ssize_t i = PyLong_AsSsize_t(v);
    if (i < 0 || i >= n) {
        PyErr_Clear();
        return -1;
    }
    return i;
}

/* Run op.check(attrs, data, *shapes). 1: passed, 0: failed with IndexError/ValueError
   (Python re-runs it and words the error), -1: any other exception (propagated). */
static int run_check(GraphObject *g, PyObject *check, PyObject *attrs, PyObject *data,
                     PyObject *ids, Py_ssize_t n) {
    PyObject *small[8];
    PyObject **argv = small;
    if (n + 2 > 8) {
        argv = PyMem_Malloc((size_t)(n + 2) * sizeof(PyObject *));
        if (!argv) {
            PyErr_NoMemory();
            return -1;
        }
    }
    argv[0] = attrs;
    argv[1] = data;
    for (Py_ssize_t k = 0; k < n; k++)
        argv[2 + k] = PyList_GET_ITEM(g->shape, PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k)));
    PyObject *r = PyObject_Vectorcall(check, argv, (size_t)(n + 2), NULL);
    if (argv != small)
        PyMem_Free(argv);
    if (r) {
        Py_DECREF(r);
        return 1;
    }
    if (PyErr_ExceptionMatches(PyExc_IndexError) || PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* PyList_Append for the node columns. A column grows by one entry per node to tens of
   thousands (a mini-batch of trees); CPython grows a list by 1/8 at a time, and each growth
   of a large list may copy it (realloc), which measured ~9% of recording. Past 4096 entries
   a column grows by half instead, through the allocator CPython's lists use (PyMem_Realloc,
   as list_resize does), so the copies amortise to a few per column. */
static int col_append(PyObject *list, PyObject *v) {
    PyListObject *l = (PyListObject *)list;
    Py_ssize_t n = Py_SIZE(l);
    if (n >= l->allocated) {
        if (n < 4096)
            return PyList_Append(list, v);
        Py_ssize_t cap = n + (n >> 1);
        if ((size_t)cap > PY_SSIZE_T_MAX / sizeof(PyObject *))
            return PyList_Append(list, v);
        PyObject **items = PyMem_Realloc(l->ob_item, (size_t)cap * sizeof(PyObject *));
        if (!items) {
            PyErr_NoMemory();
            return -1;
        }
        l->ob_item = items;
        l->allocated = cap;
    }
    Py_INCREF(v);
    PyList_SET_ITEM(list, n, v);
    Py_SET_SIZE(l, n + 1);
    return 0;
}

/* Append one value to a column, stealing the reference. */
static int append_steal(PyObject *list, PyObject *v) {
    if (!v)
        return -1;
    int rc = col_append(list, v);
    Py_DECREF(v);
    return rc;
}

/* A signature new to this graph whose shape the shared cache knows: register it exactly as
   ComputationGraph._new_signature does (sig_id[key] = known, signatures.append(key)) and
   return `known` (borrowed, owned by sig_id); NULL without an error when the cache does not
   know it (Python runs the shape rule), NULL with an error on failure. */
static PyObject *known_from_cache(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *ids, PyObject *key) {
    if (!ShapeCache || !PyDict_CheckExact(ShapeCache) || !g->signatures || !PyList_CheckExact(g->signatures))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    PyObject *shapes = PyTuple_New(n);
    if (!shapes)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *s = PyList_GET_ITEM(g->shape, PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k)));  /* checked */
        Py_INCREF(s);
        PyTuple_SET_ITEM(shapes, k, s);
    }
    PyObject *skey = PyTuple_Pack(3, op, attrs, shapes);
    Py_DECREF(shapes);
    if (!skey)
        return NULL;
    PyObject *shape = PyDict_GetItemWithError(ShapeCache, skey);  /* borrowed */
    Py_DECREF(skey);
    if (!shape || !PyTuple_CheckExact(shape))
        return NULL;
    Py_INCREF(shape);  /* the attribute lookups below may run Python code */
    /* check and blocks_grad as the op has them now, as _new_signature reads them */
    PyObject *check = PyObject_GetAttr(op, CheckName);
    PyObject *blocks = check ? PyObject_GetAttr(op, BlocksGradName) : NULL;
    PyObject *sid = blocks ? PyLong_FromSsize_t(PyList_GET_SIZE(g->signatures)) : NULL;
    PyObject *known = sid ? PyTuple_Pack(5, sid, shape, attrs, check, blocks) : NULL;
    Py_DECREF(shape);
    Py_XDECREF(check);
    Py_XDECREF(blocks);
    Py_XDECREF(sid);
    if (!known)
        return NULL;
    if (PyDict_SetItem(g->sig_id, key, known) < 0 || PyList_Append(g->signatures, key) < 0) {
        Py_DECREF(known);
        return NULL;
    }
    Py_DECREF(known);  /* sig_id holds it */
    return known;
}

/* Whether the graph's columns are the lists (of one length) that the fast path appends to;
   anything else is Python's. */
static inline int columns_ready(GraphObject *g) {
    LIST_OR_SLOW(g->op); LIST_OR_SLOW(g->args); LIST_OR_SLOW(g->attrs); LIST_OR_SLOW(g->data);
    LIST_OR_SLOW(g->shape); LIST_OR_SLOW(g->depth); LIST_OR_SLOW(g->sig); LIST_OR_SLOW(g->sig_part);
    LIST_OR_SLOW(g->needs_grad);
    if (!g->sig_id || !PyDict_CheckExact(g->sig_id))
        return 0;
    Py_ssize_t nodes = PyList_GET_SIZE(g->op);
    return PyList_GET_SIZE(g->depth) == nodes && PyList_GET_SIZE(g->sig_part) == nodes
           && PyList_GET_SIZE(g->needs_grad) == nodes && PyList_GET_SIZE(g->shape) == nodes;
}

/* The arguments' ids checked, their sig_part (part, the first SIG_CACHE_ARGS, borrowed),
   the deepest depth and whether any needs a gradient. 1, or 0 when Python must decide. */
static inline int scan_args(GraphObject *g, PyObject *ids, Py_ssize_t nodes, PyObject **part, long *depth,
                            int *needs) {
    *depth = 0;
    *needs = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ids); k++) {
        Py_ssize_t i = node_index(PyTuple_GET_ITEM(ids, k), nodes);
        if (i < 0)
            return 0;
        if (k < SIG_CACHE_ARGS)
            part[k] = PyList_GET_ITEM(g->sig_part, i);
        PyObject *d = PyList_GET_ITEM(g->depth, i);
        long dv = PyLong_CheckExact(d) ? PyLong_AsLong(d) : -1;
        if (dv < 0) {
            PyErr_Clear();
            return 0;
        }
        if (dv > *depth)
            *depth = dv;
        if (PyList_GET_ITEM(g->needs_grad, i) == Py_True)
            *needs = 1;
    }
    return 1;
}

/* The signature's `known` tuple (borrowed), past the per-graph signature cache: from sig_id
   by the key built exactly as _add_py builds it (so equal keys hash alike), else from the
   shared shape cache. NULL with *slow = 1 for a new signature (Python runs the shape rule),
   NULL with *slow = 0 and an error set on failure. */
static PyObject *lookup_signature(GraphObject *g, PyObject *op, PyObject *attrs, PyObject *ids, PyObject **part,
                                  int *slow) {
    Py_ssize_t n = PyTuple_GET_SIZE(ids);
    PyObject *parts;
    if (n == 1) {
        parts = part[0];
        Py_INCREF(parts);
    } else if (!(parts = PyTuple_New(n))) {
        *slow = 0;
        return NULL;
    } else {
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *p = PyList_GET_ITEM(g->sig_part, PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k)));  /* checked */
            Py_INCREF(p);
            PyTuple_SET_ITEM(parts, k, p);
        }
    }
    PyObject *key = PyTuple_Pack(3, op, attrs, parts);
    Py_DECREF(parts);
    if (!key) {
        *slow = 0;
        return NULL;
    }
    PyObject *known = PyDict_GetItemWithError(g->sig_id, key);  /* borrowed */
    if (!known && !PyErr_Occurred())
        known = known_from_cache(g, op, attrs, ids, key);
    if (!known && PyErr_Occurred()) {
        *slow = 0;
    } else if (known) {
        sig_cache_put(g, op, attrs, part, n, known);
        PyObject *shapes[SIG_CACHE_ARGS];
        arg_shapes(g, ids, shapes);
        global_put(op, attrs, part, shapes, n, key, known);
    }
    Py_DECREF(key);
    return known;
}

/* Node `nid` appended to every column. 0, or -1 with an error set: out of memory between
   appends, the columns may disagree then. */
static inline int append_node(GraphObject *g, PyObject *op, PyObject *ids, PyObject *known, PyObject *data,
                              PyObject *nid, long depth, int needs) {
    PyObject *shape = PyTuple_GET_ITEM(known, 1);
    PyObject *value = data ? data : Py_None;
    Py_INCREF(value);
    if (data == RandomKey) {
        Py_DECREF(value);
        PyObject *base = rand_base_of(g);
        value = base ? PyNumber_Add(base, nid) : NULL;
    }
    int blocks = PyObject_IsTrue(PyTuple_GET_ITEM(known, 4));
    if (blocks < 0 || append_steal(g->data, value) < 0 ||
        col_append(g->op, op) < 0 || col_append(g->args, ids) < 0 ||
        col_append(g->attrs, PyTuple_GET_ITEM(known, 2)) < 0 ||
        col_append(g->shape, shape) < 0 ||
        append_steal(g->depth, PyLong_FromLong(depth + 1)) < 0 ||
        col_append(g->sig, PyTuple_GET_ITEM(known, 0)) < 0 ||
        col_append(g->sig_part, shape) < 0 ||
        col_append(g->needs_grad, needs && !blocks ? Py_True : Py_False) < 0)
        return -1;
    return 0;
}

/* The fast path of add(). Returns the new node id; NULL with an error set; or NULL
   with *slow = 1 when Python must handle the call (nothing has been appended then). */
static PyObject *add_fast(GraphObject *g, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data,
                          PyObject *checked, int *slow) {
    *slow = 1;
    if (g->immediate || !PyTuple_CheckExact(ids) || (data && Py_TYPE(data) == (PyTypeObject *)IndexSlotType))
        return NULL;
    if (!columns_ready(g))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ids), nodes = PyList_GET_SIZE(g->op);
    long depth;
    int needs;
    PyObject *part[SIG_CACHE_ARGS];  /* borrowed: the arguments' sig_part, for the cache */
    if (!scan_args(g, ids, nodes, part, &depth, &needs))
        return NULL;
    PyObject *known = sig_cache_get(g, op, attrs, part, n);
    if (!known && n <= SIG_CACHE_ARGS) {  /* new to this graph: known to an earlier one? */
        PyObject *shapes[SIG_CACHE_ARGS];
        int failed;
        arg_shapes(g, ids, shapes);
        known = global_get(g, op, attrs, part, shapes, n, &failed);
        if (failed) {
            *slow = 0;
            return NULL;
        }
        if (known)
            sig_cache_put(g, op, attrs, part, n, known);
    }
    if (!known && !(known = lookup_signature(g, op, attrs, ids, part, slow)))
        return NULL;
    if (!PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 5)
        return NULL;
    PyObject *check = PyTuple_GET_ITEM(known, 3);
    if (check != Py_None && check != checked) {  /* `checked`: the check the caller has done */
        int ok = run_check(g, check, attrs, data ? data : Py_None, ids, n);
        if (ok <= 0) {
            *slow = ok == 0;
            return NULL;
        }
    }
    *slow = 0;
    PyObject *nid = PyLong_FromSsize_t(nodes);
    if (!nid)
        return NULL;
    if (append_node(g, op, ids, known, data, nid, depth, needs) < 0) {
        Py_DECREF(nid);
        return NULL;
    }
    /* node ids only (checked above): no cycle can pass through it, and the collector need
       not scan one tuple per node at every collection */
    PyObject_GC_UnTrack(ids);
    return nid;
}

static PyObject *graph_add_ids(GraphObject *g, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data,
                               PyObject *checked) {
    int slow;
    PyObject *nid = add_fast(g, op, ids, attrs, data, checked, &slow);
    if (nid || !slow)
        return nid;
    return add_in_python(g, op, ids, attrs, data ? data : Py_None);
}

/* add(op, ids, attrs=(), data=None) -> node id */
static PyObject *graph_add(GraphObject *g, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "add(op, ids, attrs=(), data=None)");
        return NULL;
    }
    PyObject *empty = NULL, *res;
    PyObject *attrs = nargs > 2 ? argv[2] : (empty = PyTuple_New(0));
    if (!attrs)
        return NULL;
    res = graph_add_ids(g, argv[0], argv[1], attrs, nargs > 3 ? argv[3] : Py_None, NULL);
    Py_XDECREF(empty);
    return res;
}

/* ----------------------------------------------------------------- parameter leaves */
/* ComputationGraph._leaf_py is the reference: a parameter's leaf node is made once per graph
   (and mode), the first time the parameter is used in it, which is several times per
   sentence in a per-sentence program. Here it is made without a Python frame when the
   parameter is an ordinary one (its storage, updated flag and signature parts in its
   __dict__, as parameters._Stored sets them); anything else is Python's. */
static PyObject *ParameterOp = NULL, *TableOp = NULL;  /* ops.inputs.PARAMETER, LOOKUP_TABLE */
static PyObject *StorageName, *UpdatedName, *SigPartsName, *IsLookupName, *ShapeName, *LeafPyName, *LeafViewName;
static PyObject *MinusOne, *Zero, *NoArgs;

int dg_leaves_configure(PyObject *parameter_op, PyObject *table_op) {
    Py_INCREF(parameter_op);
    Py_INCREF(table_op);
    Py_XSETREF(ParameterOp, parameter_op);
    Py_XSETREF(TableOp, table_op);
    return 0;
}

static inline int leaf_columns_ready(GraphObject *g) {
    LIST_OR_SLOW(g->blk); LIST_OR_SLOW(g->row); LIST_OR_SLOW(g->blocks);
    return g->block_param && PyDict_CheckExact(g->block_param) && g->leaves && PyDict_CheckExact(g->leaves);
}

/* What a new leaf of p needs from p: its storage, the shape of it, a view of it as one value
   block, whether it is a table, whether it is trained, and its signature part for `update`.
   Each a new reference; 0, or -1 when Python must decide (no error set). */
typedef struct { PyObject *values, *shape, *view, *part; int table, trained; } LeafParts;

static void leaf_parts_clear(LeafParts *lp) {
    Py_CLEAR(lp->values);
    Py_CLEAR(lp->shape);
    Py_CLEAR(lp->view);
    Py_CLEAR(lp->part);
}

static int leaf_parts(PyObject *p, int update, LeafParts *lp) {
    memset(lp, 0, sizeof(*lp));
    PyObject *dict = PyObject_GenericGetDict(p, NULL);  /* new reference */
    if (!dict || !PyDict_CheckExact(dict)) {
        Py_XDECREF(dict);
        PyErr_Clear();
        return -1;
    }
    PyObject *values = PyDict_GetItemWithError(dict, StorageName);
    PyObject *updated = values ? PyDict_GetItemWithError(dict, UpdatedName) : NULL;
    PyObject *parts = updated ? PyDict_GetItemWithError(dict, SigPartsName) : NULL;
    if (!parts || (updated != Py_True && updated != Py_False) || !PyTuple_CheckExact(parts) ||
        PyTuple_GET_SIZE(parts) != 2) {
        Py_DECREF(dict);
        PyErr_Clear();
        return -1;
    }
    lp->trained = updated == Py_True;
    lp->part = PyTuple_GET_ITEM(parts, update ? 0 : 1);
    Py_INCREF(lp->part);
    lp->values = values;
    Py_INCREF(values);  /* the attribute reads below may run Python code */
    /* (storage, storage[None], its shape) as the last graph made them, while the storage is
       the same array: a view is never changed in place, so graphs may share it, and the same
       shape object lets the signature cache across graphs hit */
    PyObject *made = PyDict_GetItemWithError(dict, LeafViewName);
    if (!made)
        PyErr_Clear();
    if (made && PyTuple_CheckExact(made) && PyTuple_GET_SIZE(made) == 3 && PyTuple_GET_ITEM(made, 0) == values &&
        PyTuple_CheckExact(PyTuple_GET_ITEM(made, 2))) {
        lp->view = Py_NewRef(PyTuple_GET_ITEM(made, 1));
        lp->shape = Py_NewRef(PyTuple_GET_ITEM(made, 2));
        made = NULL;
    } else {
        made = Py_NewRef(dict);  /* where the new view goes */
    }
    Py_DECREF(dict);
    PyObject *is_lookup = PyObject_GetAttr(p, IsLookupName);
    lp->table = is_lookup ? PyObject_IsTrue(is_lookup) : -1;
    Py_XDECREF(is_lookup);
    if (made && lp->table >= 0) {
        lp->shape = PyObject_GetAttr(values, ShapeName);
        if (lp->shape && PyTuple_CheckExact(lp->shape))
            lp->view = PyObject_GetItem(values, Py_None);  /* values[None] */
        PyObject *entry = lp->view ? PyTuple_Pack(3, values, lp->view, lp->shape) : NULL;
        if (!entry || PyDict_SetItem(made, LeafViewName, entry) < 0)
            Py_CLEAR(lp->view);
        Py_XDECREF(entry);
    }
    Py_XDECREF(made);
    if (lp->table < 0 || !lp->view) {
        PyErr_Clear();
        leaf_parts_clear(lp);
        return -1;
    }
    return 0;
}

/* Append leaf `nid` of p to every column, as _leaf_py does. 0, or -1 with an error set. */
static int append_leaf(GraphObject *g, PyObject *p, PyObject *key, PyObject *nid, LeafParts *lp, int update) {
    Py_ssize_t n = PyList_GET_SIZE(g->op);
    while (PyList_GET_SIZE(g->blk) < n)  /* _sync_values(), inline */
        if (col_append(g->blk, MinusOne) < 0 || col_append(g->row, Zero) < 0)
            return -1;
    PyObject *b = PyLong_FromSsize_t(PyList_GET_SIZE(g->blocks));
    if (!b)
        return -1;
    int rc = -1;
    PyObject *attrs = PyTuple_Pack(2, lp->shape, p);
    if (attrs && col_append(g->op, lp->table ? TableOp : ParameterOp) == 0 && col_append(g->args, NoArgs) == 0 &&
        col_append(g->attrs, attrs) == 0 && col_append(g->data, Py_None) == 0 &&
        col_append(g->shape, lp->shape) == 0 && col_append(g->depth, Zero) == 0 &&
        col_append(g->sig, MinusOne) == 0 && col_append(g->sig_part, lp->part) == 0 &&
        col_append(g->needs_grad, update && lp->trained ? Py_True : Py_False) == 0 &&
        PyDict_SetItem(g->block_param, b, p) == 0 && col_append(g->blk, b) == 0 &&
        col_append(g->row, Zero) == 0 && col_append(g->blocks, lp->view) == 0 &&
        PyDict_SetItem(g->leaves, key, nid) == 0)
        rc = 0;
    Py_XDECREF(attrs);
    Py_DECREF(b);
    return rc;
}

PyObject *dg_graph_leaf(PyObject *cg, PyObject *p, int update, int *slow) {
    *slow = 1;
    if (!ParameterOp || !PyObject_TypeCheck(cg, &GraphBaseType))
        return NULL;
    GraphObject *g = (GraphObject *)cg;
    if (!columns_ready(g) || !leaf_columns_ready(g))
        return NULL;
    PyObject *key = update ? p : PyTuple_Pack(2, p, Py_False);
    if (!key) {
        *slow = 0;
        return NULL;
    }
    if (update)
        Py_INCREF(key);
    PyObject *nid = PyDict_GetItemWithError(g->leaves, key);  /* borrowed */
    if (nid || PyErr_Occurred()) {
        *slow = 0;
        Py_XINCREF(nid);
        Py_DECREF(key);
        return nid;
    }
    LeafParts lp;
    if (leaf_parts(p, update, &lp) < 0) {
        Py_DECREF(key);
        return NULL;
    }
    *slow = 0;
    if (!columns_ready(g) || !leaf_columns_ready(g) ||
        PyDict_Contains(g->leaves, key) != 0) {  /* Python code ran meanwhile: let it decide */
        *slow = !PyErr_Occurred();
        leaf_parts_clear(&lp);
        Py_DECREF(key);
        return NULL;
    }
    nid = PyLong_FromSsize_t(PyList_GET_SIZE(g->op));
    if (nid && append_leaf(g, p, key, nid, &lp, update) < 0)
        Py_CLEAR(nid);
    leaf_parts_clear(&lp);
    Py_DECREF(key);
    return nid;
}

/* leaf(p, update=True) -> node id (see ComputationGraph._leaf_py) */
static PyObject *graph_leaf(GraphObject *g, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *update = nargs > 1 ? argv[1] : Py_True;
    if (kwnames && PyTuple_GET_SIZE(kwnames) == 1 && nargs == 1 &&
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "update") == 0)
        update = argv[1];
    else if ((kwnames && PyTuple_GET_SIZE(kwnames)) || nargs < 1 || nargs > 2)
        update = NULL;
    if (update == Py_True || update == Py_False) {
        int slow;
        PyObject *nid = dg_graph_leaf((PyObject *)g, argv[0], update == Py_True, &slow);
        if (nid || !slow)
            return nid;
    }
    /* anything else (an update flag that is not a bool, a stand-in parameter): Python */
    PyObject *m = PyObject_GetAttr((PyObject *)g, LeafPyName);
    if (!m)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, argv, nargsf, kwnames);
    Py_DECREF(m);
    return r;
}

static int leaf_names(void) {
    const char *names[7] = {"_values_storage", "_updated", "_sig_parts", "is_lookup", "shape", "_leaf_py",
                            "_leaf_view"};
    PyObject **slots[7] = {&StorageName, &UpdatedName, &SigPartsName, &IsLookupName, &ShapeName, &LeafPyName,
                           &LeafViewName};
    for (int k = 0; k < 7; k++)
        if (!*slots[k] && !(*slots[k] = PyUnicode_InternFromString(names[k])))
            return -1;
    if (!MinusOne && !(MinusOne = PyLong_FromLong(-1)))
        return -1;
    if (!Zero && !(Zero = PyLong_FromLong(0)))
        return -1;
    if (!NoArgs && !(NoArgs = PyTuple_New(0)))
        return -1;
    return 0;
}

static PyGetSetDef graph_getset[] = {
    {"_rand_base", (getter)graph_get_rand_base, (setter)graph_set_rand_base,
     "random key of node 0 (node i's is this + i), drawn on first use", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef graph_methods[] = {
    {"_start", (PyCFunction)graph_start, METH_NOARGS, "_start(): the new graph's empty columns."},
    {"add", (PyCFunction)(void (*)(void))graph_add, METH_FASTCALL,
     "add(op, ids, attrs=(), data=None) -> node id. Record one node (see ComputationGraph._add_py)."},
    {"leaf", (PyCFunction)(void (*)(void))graph_leaf, METH_FASTCALL | METH_KEYWORDS,
     "leaf(p, update=True) -> node id. The node of parameter p in this graph (see ComputationGraph._leaf_py)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef graph_members[] = {
    {"op", T_OBJECT_EX, offsetof(GraphObject, op), 0, NULL},
    {"args", T_OBJECT_EX, offsetof(GraphObject, args), 0, NULL},
    {"attrs", T_OBJECT_EX, offsetof(GraphObject, attrs), 0, NULL},
    {"data", T_OBJECT_EX, offsetof(GraphObject, data), 0, NULL},
    {"shape", T_OBJECT_EX, offsetof(GraphObject, shape), 0, NULL},
    {"depth", T_OBJECT_EX, offsetof(GraphObject, depth), 0, NULL},
    {"sig", T_OBJECT_EX, offsetof(GraphObject, sig), 0, NULL},
    {"sig_part", T_OBJECT_EX, offsetof(GraphObject, sig_part), 0, NULL},
    {"needs_grad", T_OBJECT_EX, offsetof(GraphObject, needs_grad), 0, NULL},
    {"_sig_id", T_OBJECT_EX, offsetof(GraphObject, sig_id), 0, NULL},
    {"signatures", T_OBJECT_EX, offsetof(GraphObject, signatures), 0, NULL},
    {"_leaves", T_OBJECT_EX, offsetof(GraphObject, leaves), 0, NULL},
    {"blk", T_OBJECT_EX, offsetof(GraphObject, blk), 0, NULL},
    {"row", T_OBJECT_EX, offsetof(GraphObject, row), 0, NULL},
    {"blocks", T_OBJECT_EX, offsetof(GraphObject, blocks), 0, NULL},
    {"_block_param", T_OBJECT_EX, offsetof(GraphObject, block_param), 0, NULL},
    {"retired", T_BOOL, offsetof(GraphObject, retired), 0, NULL},
    {"immediate_compute", T_BOOL, offsetof(GraphObject, immediate), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject GraphBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dynagraph._bookkeeping.GraphBase",
    .tp_basicsize = sizeof(GraphObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The node columns of a ComputationGraph, and its add() fast path.",
    .tp_traverse = (traverseproc)graph_traverse,
    .tp_clear = (inquiry)graph_clear,
    .tp_dealloc = (destructor)graph_dealloc,
    .tp_methods = graph_methods,
    .tp_members = graph_members,
    .tp_getset = graph_getset,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------- for leaves.c (bookkeeping.h) */
PyObject *dg_live_leaves(PyObject *cg) {
    if (!PyObject_TypeCheck(cg, &GraphBaseType))
        return NULL;
    GraphObject *g = (GraphObject *)cg;
    if (g->retired || !g->leaves || !PyDict_CheckExact(g->leaves))
        return NULL;
    return g->leaves;
}

PyObject *dg_graph_add(PyObject *cg, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data) {
    return graph_add_ids((GraphObject *)cg, op, ids, attrs, data, NULL);
}

PyObject *dg_graph_add_checked(PyObject *cg, PyObject *op, PyObject *ids, PyObject *attrs, PyObject *data,
                               PyObject *checked) {
    return graph_add_ids((GraphObject *)cg, op, ids, attrs, data, checked);
}

/* --------------------------------------------------------------------- module */
/* The graph's share of configure() (expr_recorder.c checks and keeps the Expression class). */
void dg_graph_configure(PyObject *slot, PyObject *key, PyObject *shapes, PyObject *draw) {
    Py_XINCREF(draw);
    Py_XSETREF(RandDraw, draw);
    Py_INCREF(slot);
    Py_INCREF(key);
    Py_XSETREF(IndexSlotType, slot);
    Py_XSETREF(RandomKey, key);
    Py_XINCREF(shapes);
    Py_XSETREF(ShapeCache, shapes);
}

int dg_recorder_add_types(PyObject *m) {
    if (PyType_Ready(&GraphBaseType) < 0 || leaf_names() < 0)
        return -1;
    if (!AddPyName && !(AddPyName = PyUnicode_InternFromString("_add_py")))
        return -1;
    if (!CheckName && !(CheckName = PyUnicode_InternFromString("check")))
        return -1;
    if (!BlocksGradName && !(BlocksGradName = PyUnicode_InternFromString("blocks_grad")))
        return -1;
    Py_INCREF(&GraphBaseType);
    if (PyModule_AddObject(m, "GraphBase", (PyObject *)&GraphBaseType) < 0) {
        Py_DECREF(&GraphBaseType);
        return -1;
    }
    return 0;
}
