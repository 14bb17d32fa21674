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

typedef struct { Py_ssize_t root; Py_ssize_t sig; } SigKey;

/* open-addressing set of (instance root, signature) pairs */
typedef struct { SigKey *slots; Py_ssize_t cap; } SigSet;

static Py_ssize_t hash_pair(Py_ssize_t r, Py_ssize_t s, Py_ssize_t cap) {
    size_t h = (size_t)r * 0x9E3779B97F4A7C15ull ^ ((size_t)s + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
    return (Py_ssize_t)(h & (size_t)(cap - 1));
}

static int sigset_has(SigSet *t, Py_ssize_t r, Py_ssize_t s) {
    Py_ssize_t i = hash_pair(r, s, t->cap);
    while (t->slots[i].root != -1) {
        if (t->slots[i].root == r && t->slots[i].sig == s) return 1;
        i = (i + 1) & (t->cap - 1);
    }
    return 0;
}

static void sigset_add(SigSet *t, Py_ssize_t r, Py_ssize_t s) {
    Py_ssize_t i = hash_pair(r, s, t->cap);
    while (t->slots[i].root != -1) {
        if (t->slots[i].root == r && t->slots[i].sig == s) return;
        i = (i + 1) & (t->cap - 1);
    }
    t->slots[i].root = r;
    t->slots[i].sig = s;
}

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

static PyObject *find(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *args, *sig, *ops, *data, *pending;
    Py_ssize_t max_nodes, max_args, ncache;
    if (!PyArg_ParseTuple(a, "O!O!O!O!O!nnn", &PyList_Type, &args, &PyList_Type, &sig, &PyList_Type, &ops,
                          &PyList_Type, &data, &PyList_Type, &pending, &max_nodes, &max_args, &ncache))
        return NULL;
    Py_ssize_t np_ = PyList_GET_SIZE(pending), nnodes = PyList_GET_SIZE(args);
    if (PyList_GET_SIZE(sig) < nnodes || PyList_GET_SIZE(ops) < nnodes || PyList_GET_SIZE(data) < nnodes) {
        PyErr_SetString(PyExc_ValueError, "node lists of different lengths");
        return NULL;
    }
    if (np_ == 0) return Py_BuildValue("([][])");
    Py_ssize_t lo = PyLong_AsSsize_t(PyList_GET_ITEM(pending, 0));
    Py_ssize_t hi = PyLong_AsSsize_t(PyList_GET_ITEM(pending, np_ - 1));
    if (lo < 0 || hi >= nnodes || hi < lo) { PyErr_SetString(PyExc_IndexError, "pending ids out of range"); return NULL; }
    Py_ssize_t span = hi - lo + 1;
    Py_ssize_t *owner = malloc(sizeof(Py_ssize_t) * span), *cmin = malloc(sizeof(Py_ssize_t) * span);
    Py_ssize_t *size = calloc(span, sizeof(Py_ssize_t)), *sigv = malloc(sizeof(Py_ssize_t) * span);
    Py_ssize_t *csig = malloc(sizeof(Py_ssize_t) * span);   /* signature of the last-recorded consumer */
    char *ispend = calloc(span, 1), *cmulti = calloc(span, 1), *excl = calloc(span, 1);
    signed char *cache = malloc(ncache > 0 ? ncache : 1), *uses = malloc(ncache > 0 ? ncache : 1);
    Py_ssize_t cap = 16;
    while (cap < 2 * np_ + 16) cap <<= 1;
    SigSet set = {malloc(sizeof(SigKey) * cap), cap}, shapes = {malloc(sizeof(SigKey) * cap), cap};
    PyObject *owner_list = NULL, *out = NULL, *result = NULL;
    if (!owner || !cmin || !size || !sigv || !csig || !ispend || !cmulti || !excl || !cache || !uses || !set.slots || !shapes.slots) {
        PyErr_NoMemory();
        goto done;
    }
    memset(cache, -1, ncache > 0 ? ncache : 1);
    memset(uses, 0, ncache > 0 ? ncache : 1);
    for (Py_ssize_t i = 0; i < cap; i++) set.slots[i].root = shapes.slots[i].root = -1;
    for (Py_ssize_t i = 0; i < span; i++) { owner[i] = -1; cmin[i] = -1; csig[i] = -1; }
    for (Py_ssize_t i = 0; i < np_; i++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i));
        if (n < lo || n > hi) { PyErr_SetString(PyExc_IndexError, "pending ids not ascending"); goto done; }
        ispend[n - lo] = 1;
        sigv[n - lo] = PyLong_AsSsize_t(PyList_GET_ITEM(sig, n));
    }
    if (PyErr_Occurred()) goto done;
    for (Py_ssize_t i = np_ - 1; i >= 0; i--) {
        Py_ssize_t n = PyLong_AsSsize_t(PyList_GET_ITEM(pending, i)), k = n - lo, r;
        PyObject *an = PyList_GET_ITEM(args, n);
        if (!PyTuple_Check(an)) { PyErr_SetString(PyExc_TypeError, "args entries must be tuples"); goto done; }
        Py_ssize_t nargs = PyTuple_GET_SIZE(an), sg = sigv[k];
        int ok = can_join(ops, an, nargs, n, sg, cache, ncache, max_args, nnodes, uses);
        if (ok < 0) goto done;
        /* one level of structure, hashed exactly as detect._shape does */
        unsigned long long hmask = (1ull << 62) - 1;
        unsigned long long hs = (unsigned long long)(sg + 2);
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
            if (x < 0 || x >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); goto done; }
            Py_ssize_t sx = PyLong_AsSsize_t(PyList_GET_ITEM(sig, x));
            hs = (hs * 1000003ull + (unsigned long long)(sx + 2)) & hmask;
        }
        Py_ssize_t shape_k = (Py_ssize_t)hs;
        if (!ok) {
            excl[k] = 1;
            owner[k] = r = n;
        } else {
            Py_ssize_t m = cmin[k];
            if (m < 0 || excl[m - lo] || size[m - lo] >= max_nodes) {
                r = n;
            } else if (!cmulti[k]) {
                /* shaped like a member, or read like the root: the previous repetition */
                int cut = sigset_has(&shapes, m, shape_k);
                if (!cut && sg == sigv[m - lo] && csig[m - lo] >= 0 && csig[m - lo] == csig[k]) cut = 1;
                r = cut ? n : m;
            } else if (!sigset_has(&set, m, sg)) {
                r = m;
            } else {
                r = n;
            }
            owner[k] = r;
            size[r - lo] += 1;
            sigset_add(&set, r, sg);
            sigset_add(&shapes, r, shape_k);
        }
        for (Py_ssize_t j = 0; j < nargs; j++) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j));
            if (x < 0 || x >= nnodes) { PyErr_SetString(PyExc_IndexError, "argument id out of range"); goto done; }
            Py_ssize_t q = x - lo;
            if (q >= 0 && q < span && ispend[q]) {
                if (csig[q] < 0) csig[q] = sg;
                if (cmin[q] < 0) cmin[q] = r;
                else if (cmin[q] != r) { cmulti[q] = 1; if (r < cmin[q]) cmin[q] = r; }
            }
        }
    }
    if (PyErr_Occurred()) goto done;
    /* members per instance, in id order: count, then fill (CSR by root) */
    {
        Py_ssize_t *start = calloc(span + 1, sizeof(Py_ssize_t)), *fill = NULL, *mem = NULL;
        Py_ssize_t *pos = NULL, *ext = NULL;
        if (!start) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t k = 0; k < span; k++)
            if (ispend[k] && !excl[k] && size[owner[k] - lo] > 1) start[owner[k] - lo + 1]++;
        for (Py_ssize_t k = 0; k < span; k++) start[k + 1] += start[k];
        fill = malloc(sizeof(Py_ssize_t) * (span + 1));
        mem = malloc(sizeof(Py_ssize_t) * (start[span] + 1));
        pos = malloc(sizeof(Py_ssize_t) * span);
        ext = malloc(sizeof(Py_ssize_t) * (max_nodes * (max_args > 0 ? max_args : 1) + 1));
        if (!fill || !mem || !pos || !ext) { PyErr_NoMemory(); goto csr_done; }
        memcpy(fill, start, sizeof(Py_ssize_t) * (span + 1));
        for (Py_ssize_t k = 0; k < span; k++) {
            pos[k] = -1;
            if (ispend[k] && !excl[k] && size[owner[k] - lo] > 1) mem[fill[owner[k] - lo]++] = k + lo;
        }
        out = PyList_New(0);
        if (!out) goto csr_done;
        for (Py_ssize_t rk = 0; rk < span; rk++) {
            Py_ssize_t b = start[rk], e = start[rk + 1], cnt = e - b, nkey = 0, next = 0;
            if (cnt < 2) continue;
            for (Py_ssize_t t = b; t < e; t++) nkey += 2 + PyTuple_GET_SIZE(PyList_GET_ITEM(args, mem[t]));
            PyObject *members = PyList_New(cnt), *key = PyTuple_New(nkey), *slots = PyList_New(0);
            if (!members || !key || !slots) { Py_XDECREF(members); Py_XDECREF(key); Py_XDECREF(slots); goto csr_done; }
            Py_ssize_t kk = 0;
            int err = 0;
            for (Py_ssize_t t = b; t < e && !err; t++) {
                Py_ssize_t n = mem[t];
                pos[n - lo] = t - b;
                PyList_SET_ITEM(members, t - b, PyLong_FromSsize_t(n));
                PyObject *an = PyList_GET_ITEM(args, n);
                Py_ssize_t nargs = PyTuple_GET_SIZE(an), sg = sigv[n - lo];
                PyTuple_SET_ITEM(key, kk++, PyLong_FromSsize_t(sg));
                PyTuple_SET_ITEM(key, kk++, PyLong_FromSsize_t(nargs));
                for (Py_ssize_t j = 0; j < nargs; j++) {
                    Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(an, j)), q = x - lo, ref;
                    if (q >= 0 && q < span && pos[q] >= 0 && owner[q] == rk + lo && !excl[q]) {
                        ref = pos[q];
                    } else {
                        Py_ssize_t f = 0;
                        while (f < next && ext[f] != x) f++;
                        if (f == next) ext[next++] = x;
                        ref = -1 - f;
                    }
                    PyTuple_SET_ITEM(key, kk++, PyLong_FromSsize_t(ref));
                }
                if (sg >= 0 && sg < ncache && uses[sg] > 0) {
                    if (PyList_Append(slots, PyList_GET_ITEM(data, n)) < 0) err = 1;
                }
            }
            for (Py_ssize_t t = b; t < e; t++) pos[mem[t] - lo] = -1;
            PyObject *exts = err ? NULL : PyList_New(next), *slot_t = err ? NULL : PyList_AsTuple(slots);
            Py_DECREF(slots);
            if (!exts || !slot_t) { Py_DECREF(members); Py_DECREF(key); Py_XDECREF(exts); Py_XDECREF(slot_t); goto csr_done; }
            for (Py_ssize_t f = 0; f < next; f++) PyList_SET_ITEM(exts, f, PyLong_FromSsize_t(ext[f]));
            PyObject *item = Py_BuildValue("(nNNNN)", rk + lo, members, key, exts, slot_t);
            if (!item || PyList_Append(out, item) < 0) { Py_XDECREF(item); goto csr_done; }
            Py_DECREF(item);
        }
        owner_list = PyList_New(span);
        if (owner_list)
            for (Py_ssize_t k = 0; k < span; k++) PyList_SET_ITEM(owner_list, k, PyLong_FromSsize_t(owner[k]));
    csr_done:
        free(start); free(fill); free(mem); free(pos); free(ext);
    }
    if (owner_list && out && !PyErr_Occurred()) result = PyTuple_Pack(2, owner_list, out);
done:
    Py_XDECREF(owner_list);
    Py_XDECREF(out);
    free(owner); free(cmin); free(size); free(sigv); free(csig); free(ispend); free(cmulti); free(excl);
    free(cache); free(uses); free(set.slots); free(shapes.slots);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, "find(args, sig, ops, data, pending, max_nodes, max_args, n_signatures)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_coarsen", "automatic coarsening's per-node pass",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__coarsen(void) { return PyModule_Create(&module); }
