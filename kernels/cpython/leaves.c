/* The compiled parameter/lookup expression recorder (part of dynagraph._bookkeeping; see
bookkeeping.h): `expression_of`, whose Python twin is expression._expression_of. It reads a
graph only through recorder.c's accessors (dg_live_leaves, dg_graph_add, dg_make_expr). */
#include "bookkeeping.h"

/* expression_of(p, update=True, lookup=None, graph=None): the Expression of parameter p in
   `graph` (default: the current graph), or of row `lookup` of a lookup table p, when p
   already has its leaf there (the common case: every use after the first in a graph).
   Anything else (a first use, update=False, a non-int index, no current graph yet, a
   retired graph) calls the Python twin (expression._expression_of) with the same arguments. */
static PyObject *LeafFallback = NULL, *GraphState = NULL, *LookupOp = NULL;

static PyObject *leaf_slow(PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    if (!LeafFallback) {
        PyErr_SetString(PyExc_RuntimeError, "expression_of: configure_leaves() was not called");
        return NULL;
    }
    return PyObject_Vectorcall(LeafFallback, argv, nargsf, kwnames);
}

static PyObject *expression_of(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *update = Py_True, *lookup = Py_None, *graph = Py_None;
    if (nargs < 1 || nargs > 4 || !dg_recorder_ready() || !GraphState || !LookupOp)
        return leaf_slow(argv, nargsf, kwnames);
    if (nargs > 1) update = argv[1];
    if (nargs > 2) lookup = argv[2];
    if (nargs > 3) graph = argv[3];
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k), *v = argv[nargs + k];
        if (PyUnicode_CompareWithASCIIString(name, "lookup") == 0)
            lookup = v;
        else if (PyUnicode_CompareWithASCIIString(name, "graph") == 0)
            graph = v;
        else if (PyUnicode_CompareWithASCIIString(name, "update") == 0)
            update = v;
        else
            return leaf_slow(argv, nargsf, kwnames);
    }
    if (update != Py_True || (lookup != Py_None && !PyLong_CheckExact(lookup)))
        return leaf_slow(argv, nargsf, kwnames);
    PyObject *cg = graph;
    if (cg == Py_None) {
        PyObject *state = NULL;
        if (PyContextVar_Get(GraphState, NULL, &state) < 0)
            return NULL;
        if (!state || !PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) < 1 ||
            PyTuple_GET_ITEM(state, 0) == Py_None) {
            Py_XDECREF(state);
            return leaf_slow(argv, nargsf, kwnames);
        }
        cg = PyTuple_GET_ITEM(state, 0);
        Py_DECREF(state);  /* the context still holds the tuple, and it the graph */
    }
    PyObject *leaves = dg_live_leaves(cg);  /* borrowed; NULL: not a live graph */
    if (!leaves)
        return leaf_slow(argv, nargsf, kwnames);
    PyObject *nid = PyDict_GetItemWithError(leaves, argv[0]);  /* borrowed */
    if (!nid) {
        if (PyErr_Occurred())
            return NULL;
        return leaf_slow(argv, nargsf, kwnames);
    }
    Py_INCREF(cg);  /* held across add(), which may call into Python */
    PyObject *res;
    if (lookup == Py_None) {
        Py_INCREF(nid);
        res = dg_make_expr(cg, nid);
    } else {
        PyObject *ids = PyTuple_Pack(1, nid), *empty = PyTuple_New(0);
        PyObject *out = NULL;
        if (ids && empty)
            out = dg_graph_add(cg, LookupOp, ids, empty, lookup);
        Py_XDECREF(ids);
        Py_XDECREF(empty);
        res = dg_make_expr(cg, out);
    }
    Py_DECREF(cg);
    return res;
}

/* configure_leaves(fallback, graph_state, lookup_op): what expression_of falls back to, the
   ContextVar holding (current graph, with-stack, default graph), and the lookup op. */
PyObject *dg_configure_leaves(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fallback, *state, *op;
    if (!PyArg_ParseTuple(args, "OO!O", &fallback, &PyContextVar_Type, &state, &op))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    Py_INCREF(fallback);
    Py_INCREF(state);
    Py_INCREF(op);
    Py_XSETREF(LeafFallback, fallback);
    Py_XSETREF(GraphState, state);
    Py_XSETREF(LookupOp, op);
    Py_RETURN_NONE;
}

static PyMethodDef leaf_method = {
    "expression_of", (PyCFunction)(void (*)(void))expression_of, METH_FASTCALL | METH_KEYWORDS,
    "expression_of(p, update=True, lookup=None, graph=None): the Expression of parameter p (row\n"
    "`lookup` of a lookup table) in `graph` or the current graph; see expression._expression_of."};

int dg_leaves_add(PyObject *m) {
    PyObject *f = PyCFunction_NewEx(&leaf_method, NULL, NULL);
    if (!f || PyModule_AddObject(m, "expression_of", f) < 0) {
        Py_XDECREF(f);
        return -1;
    }
    return 0;
}
