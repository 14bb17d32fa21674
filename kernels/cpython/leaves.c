/* The compiled parameter and lookup recorders (part of dynagraph._bookkeeping; see
bookkeeping.h): `expression_of`, whose Python twin is expression._expression_of, and the
user-facing `dy.parameter(p)` and `dy.lookup(E, i)` (expressions.parameter / lookup are
their twins). They read a graph through recorder.c's accessors (dg_live_leaves,
dg_graph_leaf, dg_graph_add, dg_make_expr).

A per-sentence program calls these once per weight and once per word: in Python each cost
a few frames (the index conversion, the leaf, the row check). Here the common case (an
exact Parameters / LookupParameters, an int or numpy integer row in range, a live current
graph) takes no Python frame; every other case, and every error, goes to the Python twin
with the same arguments, so messages exist once. */
#include "recorder.h"

static PyObject *NAME_CHECK;  /* "check", interned (dg_attr) */

static PyObject *LeafFallback = NULL, *GraphState = NULL, *LookupOp = NULL;
static PyObject *LookupCheck = NULL;  /* the lookup op's row check, which checked_lookup does in C */
/* configure_entries(): the exact classes the entries accept, numpy's integer base class,
   and their Python twins */
static PyObject *ParamsType = NULL, *TableType = NULL, *IntegerType = NULL;
static PyObject *ParameterFallback = NULL, *LookupFallback = NULL;

static PyObject *leaf_slow(PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    if (!LeafFallback) {
        PyErr_SetString(PyExc_RuntimeError, "expression_of: configure_leaves() was not called");
        return NULL;
    }
    return PyObject_Vectorcall(LeafFallback, argv, nargsf, kwnames);
}

/* The current graph (borrowed: the context holds it), or NULL without an error when there is
   none yet (Python makes the default graph), NULL with an error on failure. */
static PyObject *current_graph(void) {
    PyObject *state = NULL;
    if (PyContextVar_Get(GraphState, NULL, &state) < 0)
        return NULL;
    if (!state || !PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) < 1 ||
        PyTuple_GET_ITEM(state, 0) == Py_None) {
        Py_XDECREF(state);
        return NULL;
    }
    PyObject *cg = PyTuple_GET_ITEM(state, 0);
    Py_DECREF(state);  /* the context still holds the tuple, and it the graph */
    return cg;
}

/* An exact int, or a numpy integer as an int (new reference); NULL without an error for
   anything else (a bool, a float, an IndexSlot: Python decides and words the error). */
static PyObject *plain_index(PyObject *i) {
    if (PyLong_CheckExact(i)) {
        Py_INCREF(i);
        return i;
    }
    if (IntegerType && PyObject_TypeCheck(i, (PyTypeObject *)IntegerType)) {
        PyObject *v = PyNumber_Index(i);
        if (!v)
            PyErr_Clear();
        return v;
    }
    return NULL;
}

/* Row `index` (an int) of table leaf `leaf` when it is in range: the node id of the lookup
   (new reference), recorded without running the op's check in Python, which would pass.
   NULL without an error when the row is out of range (the caller takes the path whose check
   words the error), NULL with an error on failure. */
static PyObject *checked_lookup(PyObject *cg, PyObject *leaf, PyObject *index) {
    PyObject *shapes = ((GraphObject *)cg)->shape;
    Py_ssize_t li = PyLong_AsSsize_t(leaf);
    if (li < 0 || !shapes || !PyList_CheckExact(shapes) || li >= PyList_GET_SIZE(shapes)) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *shape = PyList_GET_ITEM(shapes, li);
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) < 1)
        return NULL;
    Py_ssize_t rows = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0));
    int overflow;
    long long r = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow || (r == -1 && PyErr_Occurred()) || rows < 0 || r < 0 || r >= rows) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *ids = PyTuple_Pack(1, leaf), *empty = PyTuple_New(0), *out = NULL;
    if (ids && empty)
        out = dg_graph_add_checked(cg, LookupOp, ids, empty, index, LookupCheck);
    Py_XDECREF(ids);
    Py_XDECREF(empty);
    return out;
}

/* The Expression of p (row `index` of it when index is not NULL) in live graph cg, for an
   ordinary trained parameter; NULL with *slow = 1 when the Python twin must do it. */
static PyObject *fast_expression(PyObject *cg, PyObject *p, PyObject *index, int *slow) {
    *slow = 1;
    if (!dg_live_leaves(cg))
        return NULL;
    Py_INCREF(cg);  /* held across the calls below, which may run Python code */
    PyObject *res = NULL;
    PyObject *nid = dg_graph_leaf(cg, p, 1, slow);
    if (nid && index) {
        PyObject *row = checked_lookup(cg, nid, index);
        if (!row && !PyErr_Occurred()) {  /* out of range: the op's check raises, worded */
            PyObject *ids = PyTuple_Pack(1, nid), *empty = PyTuple_New(0);
            if (ids && empty)
                row = dg_graph_add(cg, LookupOp, ids, empty, index);
            Py_XDECREF(ids);
            Py_XDECREF(empty);
        }
        Py_SETREF(nid, row);
        *slow = 0;
    }
    if (nid || !*slow)
        res = dg_make_expr(cg, nid);  /* steals nid; NULL stays NULL */
    Py_DECREF(cg);
    return res;
}

/* expression_of(p, update=True, lookup=None, graph=None): the Expression of parameter p in
   `graph` (default: the current graph), or of row `lookup` of a lookup table p. Anything but
   a trained parameter of an ordinary kind with an integer row (update=False, an IndexSlot,
   no current graph yet, a retired graph) calls the Python twin (expression._expression_of)
   with the same arguments. */
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
    if (update != Py_True)
        return leaf_slow(argv, nargsf, kwnames);
    PyObject *index = NULL;
    if (lookup != Py_None && !(index = plain_index(lookup)))
        return leaf_slow(argv, nargsf, kwnames);
    PyObject *cg = graph != Py_None ? graph : current_graph();
    int slow = 1;
    PyObject *res = cg ? fast_expression(cg, argv[0], index, &slow) : NULL;
    Py_XDECREF(index);
    if (res || !slow || PyErr_Occurred())
        return res;
    return leaf_slow(argv, nargsf, kwnames);
}

/* parameter(*ps): dy.parameter; one exact Parameters in the current graph here, else the twin. */
static PyObject *parameter(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 1 && !(kwnames && PyTuple_GET_SIZE(kwnames)) && ParamsType && GraphState &&
        (PyObject *)Py_TYPE(argv[0]) == ParamsType && dg_recorder_ready()) {
        PyObject *cg = current_graph();
        int slow = 1;
        PyObject *res = cg ? fast_expression(cg, argv[0], NULL, &slow) : NULL;
        if (res || !slow || PyErr_Occurred())
            return res;
    }
    if (!ParameterFallback) {
        PyErr_SetString(PyExc_RuntimeError, "parameter: configure_entries() was not called");
        return NULL;
    }
    return PyObject_Vectorcall(ParameterFallback, argv, nargsf, kwnames);
}

/* lookup(p, index, update=True): dy.lookup; an exact LookupParameters and an integer row in
   the current graph here, else the twin (which checks the arguments and words errors). */
static PyObject *lookup(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs >= 2 && nargs <= 3 && !(kwnames && PyTuple_GET_SIZE(kwnames)) && TableType && GraphState &&
        (PyObject *)Py_TYPE(argv[0]) == TableType && (nargs < 3 || argv[2] == Py_True) && dg_recorder_ready()) {
        PyObject *index = plain_index(argv[1]);
        PyObject *cg = index ? current_graph() : NULL;
        int slow = 1;
        PyObject *res = cg ? fast_expression(cg, argv[0], index, &slow) : NULL;
        Py_XDECREF(index);
        if (res || !slow || PyErr_Occurred())
            return res;
    }
    if (!LookupFallback) {
        PyErr_SetString(PyExc_RuntimeError, "lookup: configure_entries() was not called");
        return NULL;
    }
    return PyObject_Vectorcall(LookupFallback, argv, nargsf, kwnames);
}

/* E[i] as LookupParameters.__getitem__ (a method descriptor of the class): row i of the
   table in the current graph, with no Python frame; anything else is the Python twin,
   expression._expression_of(E, True, i), as the Python __getitem__ calls it. */
static PyObject *table_getitem(PyObject *self, PyObject *i) {
    PyObject *index = GraphState && dg_recorder_ready() ? plain_index(i) : NULL;
    PyObject *cg = index ? current_graph() : NULL;
    int slow = 1;
    PyObject *res = cg ? fast_expression(cg, self, index, &slow) : NULL;
    Py_XDECREF(index);
    if (res || !slow || PyErr_Occurred())
        return res;
    PyObject *argv[3] = {self, Py_True, i};
    return leaf_slow(argv, 3, NULL);
}

static PyMethodDef table_getitem_def = {
    "__getitem__", (PyCFunction)table_getitem, METH_O,
    "E[i]: row i of lookup table E as an expression of the current graph (see expression._expression_of)."};

/* configure_leaves(fallback, graph_state, lookup_op, parameter_op, table_op): what
   expression_of falls back to, the ContextVar holding (current graph, with-stack, default
   graph), the lookup op, and the ops of parameter and table leaves. */
PyObject *dg_configure_leaves(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fallback, *state, *op, *param_op = NULL, *table_op = NULL;
    if (!PyArg_ParseTuple(args, "OO!O|OO", &fallback, &PyContextVar_Type, &state, &op, &param_op, &table_op))
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
    PyObject *check = dg_attr(op, &NAME_CHECK, "check");  /* as configured: a replaced check runs */
    if (!check)
        return NULL;
    Py_XSETREF(LookupCheck, check);
    if (param_op && table_op && dg_leaves_configure(param_op, table_op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* configure_entries(Parameters, LookupParameters, integer, parameter_fallback, lookup_fallback)
   -> the compiled LookupParameters.__getitem__ */
static PyObject *configure_entries(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pt, *tt, *it, *pf, *lf;
    if (!PyArg_ParseTuple(args, "O!O!O!OO", &PyType_Type, &pt, &PyType_Type, &tt, &PyType_Type, &it, &pf, &lf))
        return NULL;
    if (!PyCallable_Check(pf) || !PyCallable_Check(lf)) {
        PyErr_SetString(PyExc_TypeError, "the fallbacks must be callable");
        return NULL;
    }
    PyObject *objs[5] = {pt, tt, it, pf, lf};
    PyObject **slots[5] = {&ParamsType, &TableType, &IntegerType, &ParameterFallback, &LookupFallback};
    for (int k = 0; k < 5; k++) {
        Py_INCREF(objs[k]);
        Py_XSETREF(*slots[k], objs[k]);
    }
    dg_parameter_types(pt, tt);
    return PyDescr_NewMethod((PyTypeObject *)tt, &table_getitem_def);  /* LookupParameters.__getitem__ */
}

static PyMethodDef leaf_methods[] = {
    {"expression_of", (PyCFunction)(void (*)(void))expression_of, METH_FASTCALL | METH_KEYWORDS,
     "expression_of(p, update=True, lookup=None, graph=None): the Expression of parameter p (row\n"
     "`lookup` of a lookup table) in `graph` or the current graph; see expression._expression_of."},
    {"parameter", (PyCFunction)(void (*)(void))parameter, METH_FASTCALL | METH_KEYWORDS,
     "parameter(*ps): dy.parameter; see expressions.parameter."},
    {"lookup", (PyCFunction)(void (*)(void))lookup, METH_FASTCALL | METH_KEYWORDS,
     "lookup(p, index, update=True): dy.lookup; see expressions.lookup."},
    {"configure_entries", configure_entries, METH_VARARGS,
     "configure_entries(Parameters, LookupParameters, numpy.integer, parameter_fallback, lookup_fallback): "
     "the classes dy.parameter and dy.lookup take without Python, and their Python twins; returns the\n"
     "compiled LookupParameters.__getitem__."},
    {NULL, NULL, 0, NULL},
};

int dg_leaves_add(PyObject *m) {
    for (PyMethodDef *d = leaf_methods; d->ml_name; d++) {
        PyObject *f = PyCFunction_NewEx(d, NULL, NULL);
        if (!f || PyModule_AddObject(m, d->ml_name, f) < 0) {
            Py_XDECREF(f);
            return -1;
        }
    }
    return 0;
}
