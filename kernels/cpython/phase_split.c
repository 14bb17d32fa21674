/* dy.phase inside dy.autobatch_map: which pending nodes a chunk leaves pending (concurrent.py's
   _Deferred.split). Twins: concurrent._users_split_py and graph.needed_within.

   A round of a concurrent map classifies the nodes recorded since the last round, a few hundred,
   and walks back from the values being waited for: in Python the set probes cost 50-100 us a
   round (a tenth of a DRNN step at H=128); here one pass over the ids. */
#include "bookkeeping.h"

/* args[v] as a tuple (borrowed), or NULL with an exception set. */
static PyObject *node_args(PyObject *args, PyObject *v) {
    Py_ssize_t i = dg_index_in(v, PyList_GET_SIZE(args));
    if (i < 0)
        return NULL;
    PyObject *a = PyList_GET_ITEM(args, i);
    if (!PyTuple_Check(a)) {
        PyErr_Format(PyExc_TypeError, "args[%zd] is not a tuple of node ids", i);
        return NULL;
    }
    return a;
}

/* 1 if some id of the tuple `a` is in `set`, 0 if none, -1 with an exception set. */
static int reads_any(PyObject *a, PyObject *set) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(a); k++) {
        int c = PySet_Contains(set, PyTuple_GET_ITEM(a, k));
        if (c)
            return c;
    }
    return 0;
}

/* users_split(args, tainted, nodes) -> (run, left): nodes (ascending) in `tainted` or reading a
   node of it go to `left` and into `tainted` (so a later node reading one is left too); the
   others to `run`, both in the order of `nodes`. */
PyObject *dg_users_split(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(argv[0]) || !PySet_Check(argv[1]) || !PyList_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "users_split(args: list, tainted: set, nodes: list)");
        return NULL;
    }
    PyObject *args = argv[0], *tainted = argv[1], *nodes = argv[2];
    PyObject *run = PyList_New(0), *left = PyList_New(0);
    if (!run || !left)
        goto fail;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(nodes); j++) {
        PyObject *v = PyList_GET_ITEM(nodes, j);
        int hit = PySet_Contains(tainted, v);
        if (hit == 0) {
            PyObject *a = node_args(args, v);
            if (!a)
                goto fail;
            hit = reads_any(a, tainted);
            if (hit == 1 && PySet_Add(tainted, v) < 0)
                goto fail;
        }
        if (hit < 0 || PyList_Append(hit ? left : run, v) < 0)
            goto fail;
    }
    PyObject *out = PyTuple_Pack(2, run, left);
    Py_DECREF(run);
    Py_DECREF(left);
    return out;
fail:
    Py_XDECREF(run);
    Py_XDECREF(left);
    return NULL;
}

/* Push v onto `stack` and into `needed` if it is in `within` and not yet in `needed`: 0, or -1. */
static int reach(PyObject *v, PyObject *within, PyObject *needed, PyObject *stack) {
    int c = PySet_Contains(within, v);
    if (c <= 0)
        return c;
    c = PySet_Contains(needed, v);
    if (c)
        return c < 0 ? -1 : 0;
    return (PySet_Add(needed, v) < 0 || PyList_Append(stack, v) < 0) ? -1 : 0;
}

/* needed_within(args, within, targets) -> set: graph.needed_within, the nodes of `within` that
   `targets` need (the targets in it and every node of it they read, walked back through args). */
PyObject *dg_needed_within(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(argv[0]) || !PyAnySet_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "needed_within(args: list, within: set, targets)");
        return NULL;
    }
    PyObject *args = argv[0], *within = argv[1];
    PyObject *targets = PySequence_Fast(argv[2], "needed_within: targets must be a sequence");
    PyObject *needed = PySet_New(NULL), *stack = PyList_New(0);
    if (!targets || !needed || !stack)
        goto fail;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(targets); j++)
        if (reach(PySequence_Fast_GET_ITEM(targets, j), within, needed, stack) < 0)
            goto fail;
    while (PyList_GET_SIZE(stack)) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        PyObject *v = PyList_GET_ITEM(stack, top);
        Py_INCREF(v);
        if (PyList_SetSlice(stack, top, top + 1, NULL) < 0) {
            Py_DECREF(v);
            goto fail;
        }
        PyObject *a = node_args(args, v);
        Py_DECREF(v);  /* `needed` holds it */
        if (!a)
            goto fail;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(a); k++)
            if (reach(PyTuple_GET_ITEM(a, k), within, needed, stack) < 0)
                goto fail;
    }
    Py_DECREF(targets);
    Py_DECREF(stack);
    return needed;
fail:
    Py_XDECREF(targets);
    Py_XDECREF(needed);
    Py_XDECREF(stack);
    return NULL;
}
