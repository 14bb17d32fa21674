/* BlockPool: numpy.empty and numpy.zeros for the small value and gradient blocks of the compiled
steps, with arrays reused once nothing else holds them (part of dynagraph._bookkeeping; see
bookkeeping.h).

A per-sentence program makes a new graph of the same shapes for every sentence: each batch's
output and each gradient block is a new numpy array of one to a few rows, made by numpy.empty
(~1,400 instructions: argument parsing, descriptor, allocation) and freed with its graph
(several hundred more). Per sentence of a BiRNN tagger at H=64 that is ~980 arrays, about a
tenth of its work (callgrind).

The pool keeps a reference to every array it hands out (per dtype and exact shape, in a ring).
An array whose only reference is the pool's (its refcount is 1) is no longer in any graph,
view, buffer export or user variable: anything else that holds it, a view's base included,
holds a reference. Such an array is handed out again as numpy.empty's result would be: same
type, shape, dtype and layout, contents unspecified. Successive sentences allocate in the same
order, so the ring's cursor usually finds a free array at the first probe.

Bounded: only arrays of at most max_array_bytes are kept, at most RING_CAP per shape and
max_total_bytes in all; anything else is numpy.empty's (numpy.zeros') own array, not kept. A
new array is made by numpy.empty or numpy.zeros as asked, so only a reused one is cleared here.
The twins are numpy.empty and numpy.zeros themselves (the numpy backend has no pool). */
#include "bookkeeping.h"
#include <structmember.h> /* PyMemberDef, T_PYSSIZET */

/* Arrays kept per shape, at most: a sentence's live blocks of its commonest shape. A BiRNN tagger
   at H=64 holds over a thousand (1, 32) blocks at once in a long sentence (values and gradients of
   both directions' cells); at 512 its ring was full, and 98 of those blocks a sentence were new
   numpy arrays. A ring starts small and doubles as it fills. */
#define RING_CAP 4096
#define RING_START 16
#define PROBES 4      /* ring entries tried before a new array is made */

typedef struct {
    Py_ssize_t n, cursor, cap;
    PyObject **a;  /* cap entries, n of them used */
} Ring;

/* A direct-mapped cache in front of the dicts, for shapes of at most two dimensions: a caller
   passes a new shape tuple each time, and the dict compared it item by item with its key. */
#define SLOTS 256
typedef struct {
    int t, nd;
    Py_ssize_t d0, d1;
    Ring *r;  /* NULL: empty; valid while the ring's capsule is in its dict (until clear()) */
} Slot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *make[2];       /* numpy.empty, numpy.zeros: new arrays */
    PyObject *dtypes[2];     /* numpy.dtype(float32), numpy.dtype(float64): identity-compared */
    PyObject *rings[2];      /* per dtype: shape tuple -> capsule(Ring) */
    Py_ssize_t itemsize[2];
    Py_ssize_t max_array, max_total, total;
    Py_ssize_t hits, misses;
    Slot slots[SLOTS];
} BlockPoolObject;

static void ring_free(PyObject *capsule) {
    Ring *r = PyCapsule_GetPointer(capsule, NULL);
    if (!r)
        return;
    for (Py_ssize_t i = 0; i < r->n; i++)
        Py_DECREF(r->a[i]);
    PyMem_Free(r->a);
    PyMem_Free(r);
}

/* Elements of a shape tuple of non-negative ints, or -1 (not one the pool keeps). */
static Py_ssize_t shape_elements(PyObject *shape, Py_ssize_t limit) {
    Py_ssize_t n = 1;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
        PyObject *v = PyTuple_GET_ITEM(shape, d);
        if (!PyLong_CheckExact(v))
            return -1;
        Py_ssize_t k = PyLong_AsSsize_t(v);
        if (k < 0) {
            PyErr_Clear();
            return -1;
        }
        if (k && n > limit / k)
            return -1;
        n *= k;
    }
    return n;
}

/* A free array of ring r (refcount 1: only the pool holds it), a new reference; NULL if none
   of the next PROBES is free. The cursor moves past the entries tried either way: an array
   held for good (a parameter's adopted gradient) must not stop every later call at it. */
static PyObject *ring_take(Ring *r) {
    Py_ssize_t probes = r->n < PROBES ? r->n : PROBES;
    for (Py_ssize_t k = 0; k < probes; k++) {
        Py_ssize_t i = (r->cursor + k) % r->n;
        PyObject *a = r->a[i];
        if (Py_REFCNT(a) == 1) {
            r->cursor = (i + 1) % r->n;
            Py_INCREF(a);
            return a;
        }
    }
    if (r->n)
        r->cursor = (r->cursor + probes) % r->n;
    return NULL;
}

/* Keeps a new array of `bytes` in the ring of `shape` (dtype t) when the bounds allow. */
static int pool_keep(BlockPoolObject *p, int t, PyObject *shape, PyObject *a, Py_ssize_t bytes) {
    if (bytes > p->max_array || p->total + bytes > p->max_total)
        return 0;
    PyObject *cap = PyDict_GetItemWithError(p->rings[t], shape);
    if (!cap) {
        if (PyErr_Occurred())
            return -1;
        Ring *r = PyMem_Malloc(sizeof(Ring));
        PyObject **a0 = r ? PyMem_Malloc(RING_START * sizeof(PyObject *)) : NULL;
        if (!a0) {
            PyMem_Free(r);
            PyErr_NoMemory();
            return -1;
        }
        r->n = r->cursor = 0;
        r->cap = RING_START;
        r->a = a0;
        if (!(cap = PyCapsule_New(r, NULL, ring_free))) {
            PyMem_Free(a0);
            PyMem_Free(r);
            return -1;
        }
        int bad = PyDict_SetItem(p->rings[t], shape, cap);
        Py_DECREF(cap);  /* the dict holds it */
        if (bad < 0)
            return -1;
    }
    Ring *r = PyCapsule_GetPointer(cap, NULL);
    if (!r)
        return -1;
    if (r->n == r->cap && r->cap < RING_CAP) {  /* full: twice the room, up to RING_CAP */
        PyObject **grown = PyMem_Realloc(r->a, 2 * (size_t)r->cap * sizeof(PyObject *));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        r->a = grown;
        r->cap *= 2;
    }
    Py_INCREF(a);
    if (r->n < r->cap) {
        r->a[r->n++] = a;
        p->total += bytes;
        return 0;
    }
    /* full, every probed entry still in use: the new array takes the place of the one the
       cursor just passed (the pool forgets that one; whoever holds it keeps it) */
    Py_ssize_t i = (r->cursor + r->n - 1) % r->n;
    PyObject *old = r->a[i];
    r->a[i] = a;
    Py_DECREF(old);
    return 0;
}

/* A free kept array of this shape and dtype (a new reference), or NULL: with an exception set on
   error, else none was free (*t, *keep: the dtype index and whether a new array may be kept). */
static PyObject *pool_take(BlockPoolObject *p, PyObject *shape, PyObject *dtype, int *t, int *keep) {
    *t = dtype == p->dtypes[0] ? 0 : dtype == p->dtypes[1] ? 1 : -1;
    *keep = *t >= 0 && PyTuple_CheckExact(shape);
    if (!*keep)
        return NULL;
    Slot *slot = NULL;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape), d0 = 0, d1 = 0;
    if (nd <= 2 && (nd < 1 || PyLong_CheckExact(PyTuple_GET_ITEM(shape, 0)))
        && (nd < 2 || PyLong_CheckExact(PyTuple_GET_ITEM(shape, 1)))) {
        d0 = nd >= 1 ? dg_as_ssize(PyTuple_GET_ITEM(shape, 0)) : 0;
        d1 = nd >= 2 ? dg_as_ssize(PyTuple_GET_ITEM(shape, 1)) : 0;
        if ((d0 == -1 || d1 == -1) && PyErr_Occurred())
            return NULL;
        slot = &p->slots[((size_t)d0 * 131u + (size_t)d1 * 7u + (size_t)nd * 3u + (size_t)*t) & (SLOTS - 1)];
        if (slot->r && slot->t == *t && slot->nd == nd && slot->d0 == d0 && slot->d1 == d1)
            return ring_take(slot->r);  /* the ring is known: NULL makes a new array, kept there */
        slot->r = NULL;  /* refilled below from the dict, if it has this shape */
        slot->t = *t, slot->nd = (int)nd, slot->d0 = d0, slot->d1 = d1;
    } else if (nd <= 2) {
        return NULL;  /* not ints: numpy.empty's business (shape_elements keeps none of these) */
    }
    PyObject *cap = PyDict_GetItemWithError(p->rings[*t], shape);
    if (!cap)
        return NULL;
    Ring *r = PyCapsule_GetPointer(cap, NULL);
    if (!r)
        return NULL;
    if (slot)
        slot->r = r;
    return ring_take(r);
}

/* numpy.empty / numpy.zeros (zero) of (shape, dtype), reusing a free kept array where one fits. */
static PyObject *pool_get(BlockPoolObject *p, PyObject *const *args, Py_ssize_t nargs, int zero) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "BlockPool.%s(shape, dtype): two positional arguments", zero ? "zeros" : "empty");
        return NULL;
    }
    int t, keep;
    PyObject *a = pool_take(p, args[0], args[1], &t, &keep);
    if (a) {
        p->hits++;
        if (zero) {
            Py_buffer v;
            if (dg_get_buffer(a, &v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {  /* array_view.c: its direct view */
                Py_DECREF(a);
                return NULL;
            }
            memset(v.buf, 0, (size_t)v.len);
            PyBuffer_Release(&v);
        }
        return a;
    }
    if (PyErr_Occurred() || !(a = PyObject_Vectorcall(p->make[zero], args, 2, NULL)) || !keep)
        return a;
    p->misses++;
    Py_ssize_t n = shape_elements(args[0], p->max_array / p->itemsize[t]);
    if (n >= 0 && pool_keep(p, t, args[0], a, n * p->itemsize[t]) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* pool(shape, dtype) and pool.empty(shape, dtype): as numpy.empty. */
static PyObject *pool_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "BlockPool(shape, dtype): positional arguments only");
        return NULL;
    }
    return pool_get((BlockPoolObject *)self, args, PyVectorcall_NARGS(nargsf), 0);
}

static PyObject *pool_empty_method(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return pool_get((BlockPoolObject *)self, args, nargs, 0);
}

/* pool.zeros(shape, dtype): as numpy.zeros. */
static PyObject *pool_zeros(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return pool_get((BlockPoolObject *)self, args, nargs, 1);
}

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *empty, *zeros, *f32, *f64;
    Py_ssize_t max_array, max_total;
    static char *names[] = {"empty", "zeros", "float32", "float64", "max_array_bytes", "max_total_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOnn:BlockPool", names, &empty, &zeros, &f32, &f64, &max_array,
                                     &max_total))
        return NULL;
    if (!PyCallable_Check(empty) || !PyCallable_Check(zeros) || max_array < 0 || max_total < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "BlockPool(empty, zeros, float32, float64, max_array_bytes >= 0, max_total_bytes >= 0)");
        return NULL;
    }
    Py_ssize_t size[2];
    PyObject *dt[2] = {f32, f64};
    for (int t = 0; t < 2; t++) {  /* dtype.itemsize: 4 and 8, asked rather than assumed */
        PyObject *v = PyObject_GetAttrString(dt[t], "itemsize");
        size[t] = v ? PyLong_AsSsize_t(v) : -1;
        Py_XDECREF(v);
        if (size[t] <= 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "BlockPool: a dtype without a positive itemsize");
            return NULL;
        }
    }
    BlockPoolObject *p = (BlockPoolObject *)type->tp_alloc(type, 0);
    if (!p)
        return NULL;
    p->vectorcall = pool_call;
    Py_INCREF(empty);
    Py_INCREF(zeros);
    p->make[0] = empty;
    p->make[1] = zeros;
    for (int t = 0; t < 2; t++) {
        Py_INCREF(dt[t]);
        p->dtypes[t] = dt[t];
        p->itemsize[t] = size[t];
        if (!(p->rings[t] = PyDict_New())) {
            Py_DECREF(p);
            return NULL;
        }
    }
    p->max_array = max_array;
    p->max_total = max_total;
    return (PyObject *)p;
}

static void pool_dealloc(PyObject *self) {
    BlockPoolObject *p = (BlockPoolObject *)self;
    Py_XDECREF(p->make[0]);
    Py_XDECREF(p->make[1]);
    for (int t = 0; t < 2; t++) {
        Py_XDECREF(p->dtypes[t]);
        Py_XDECREF(p->rings[t]);
    }
    Py_TYPE(self)->tp_free(self);
}

/* clear(): forget every kept array (arrays still in use stay valid: they are only not reused). */
static PyObject *pool_clear(PyObject *self, PyObject *unused) {
    (void)unused;
    BlockPoolObject *p = (BlockPoolObject *)self;
    for (int t = 0; t < 2; t++)
        PyDict_Clear(p->rings[t]);
    memset(p->slots, 0, sizeof p->slots);  /* their rings went with the dicts */
    p->total = 0;
    Py_RETURN_NONE;
}

static PyObject *pool_kept(PyObject *self, void *closure) {
    (void)closure;
    BlockPoolObject *p = (BlockPoolObject *)self;
    Py_ssize_t n = 0;
    for (int t = 0; t < 2; t++) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(p->rings[t], &pos, &k, &v)) {
            Ring *r = PyCapsule_GetPointer(v, NULL);
            if (!r)
                return NULL;
            n += r->n;
        }
    }
    return PyLong_FromSsize_t(n);
}

static PyMethodDef pool_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))pool_empty_method, METH_FASTCALL,
     "empty(shape, dtype): as numpy.empty, reusing a kept array nothing else holds."},
    {"zeros", (PyCFunction)(void (*)(void))pool_zeros, METH_FASTCALL,
     "zeros(shape, dtype): as numpy.zeros, reusing a kept array nothing else holds."},
    {"clear", pool_clear, METH_NOARGS, "clear(): forget every kept array."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pool_members[] = {
    {"hits", T_PYSSIZET, offsetof(BlockPoolObject, hits), READONLY, "calls served by a kept array"},
    {"misses", T_PYSSIZET, offsetof(BlockPoolObject, misses), READONLY, "float calls that made a new array"},
    {"kept_bytes", T_PYSSIZET, offsetof(BlockPoolObject, total), READONLY, "bytes of the arrays kept"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"kept", pool_kept, NULL, "number of arrays kept", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BlockPoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dynagraph._bookkeeping.BlockPool",
    .tp_doc = "BlockPool(empty, zeros, float32, float64, max_array_bytes, max_total_bytes): numpy.empty(shape, dtype) "
              "for small float blocks, reusing an array the pool alone still holds; see block_pool.c.",
    .tp_basicsize = sizeof(BlockPoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = pool_new,
    .tp_dealloc = pool_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(BlockPoolObject, vectorcall),
    .tp_methods = pool_methods,
    .tp_members = pool_members,
    .tp_getset = pool_getset,
};

int dg_block_pool_add_type(PyObject *m) {
    if (PyType_Ready(&BlockPoolType) < 0)
        return -1;
    Py_INCREF(&BlockPoolType);
    if (PyModule_AddObject(m, "BlockPool", (PyObject *)&BlockPoolType) < 0) {
        Py_DECREF(&BlockPoolType);
        return -1;
    }
    return PyModule_AddIntConstant(m, "BLOCK_POOL_RING_CAP", RING_CAP);  /* arrays kept per shape */
}
