/* Expressions and recorders (part of dynagraph._bookkeeping; see bookkeeping.h and recorder.c).

  ExprBase    base class of Expression: two fields, cg and i
  Recorder    a callable that records one op from Expression arguments through the graph's
              add() fast path (recorder.c), or calls its Python fallback with the same arguments
*/
#include "recorder.h"
#include <structmember.h>

/* ------------------------------------------------------------------- ExprBase */
static PyObject *EmptyAttrs = NULL;  /* () */

/* Expressions are not GC objects. An expression holds its graph (untracked: recorder.c's
   graph_new) and an int, so no cycle can pass through one; as GC objects, every op's
   expression counted towards a collection and lived in the young generation until the user
   dropped it. A TreeLSTM or BiLSTM mini-batch made ~50 collections a step, and the expressions
   a user keeps (its lists of states) reached the old generation and set off full collections
   of the whole heap. Expression itself is built from a spec (plain_expression_type below):
   a class statement makes a GC type whatever its base. */
static void expr_dealloc(ExprObject *e) {
    Py_CLEAR(e->cg);
    Py_CLEAR(e->i);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* Expression's dealloc: its instances, as any heap type's, hold a reference to their type. */
static void expr_heap_dealloc(ExprObject *e) {
    PyTypeObject *tp = Py_TYPE(e);
    expr_dealloc(e);
    Py_DECREF(tp);
}

static PyObject *expr_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *cg, *i;
    static char *names[] = {"cg", "i", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", names, &cg, &i))
        return NULL;
    ExprObject *e = (ExprObject *)type->tp_alloc(type, 0);
    if (e) {
        Py_INCREF(cg);
        Py_INCREF(i);
        e->cg = cg;
        e->i = i;
    }
    return (PyObject *)e;
}

static PyMemberDef expr_members[] = {
    {"cg", T_OBJECT_EX, offsetof(ExprObject, cg), 0, "the ComputationGraph this expression belongs to"},
    {"i", T_OBJECT_EX, offsetof(ExprObject, i), 0, "its node id"},
    {NULL, 0, 0, 0, NULL},
};

/* The arithmetic operators x + y, x - y, x * y (DyNet: a matrix product) as C slots: an
   operator in a Python method cost a frame per op, and a cell written from primitive ops
   uses several per step. Two live Expressions of one graph, or an Expression and an exact
   int or float (the constant forms addc, rsubc, mulc) are recorded here; anything else goes
   to the operator's Python twin (expression._add, ...), with the operands as Python passed
   them, which handles the rest and words every error. Configured by configure_operators(). */
enum { OP_ADD, OP_SUB, OP_MUL, N_OPERATORS };
static PyObject *PairOp[N_OPERATORS];       /* add, sub, matmul */
static PyObject *ConstOp[N_OPERATORS];      /* x + c: addc, x - c: addc (of -c), x * c: mulc */
static PyObject *RConstOp[N_OPERATORS];     /* c + x: addc, c - x: rsubc, c * x: mulc */
static PyObject *OperatorTwin[N_OPERATORS];

static PyObject *record_exprs(PyObject *op, PyObject *const *xs, Py_ssize_t n, PyObject *attrs,
                              PyObject *data, int *slow);

/* An exact int or float (not a bool) as a float, else NULL without an error. */
static PyObject *plain_number(PyObject *c) {
    if (PyFloat_CheckExact(c)) {
        Py_INCREF(c);
        return c;
    }
    if (PyLong_CheckExact(c)) {
        double v = PyLong_AsDouble(c);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        return PyFloat_FromDouble(v);
    }
    return NULL;
}

static PyObject *expr_operator(int which, PyObject *a, PyObject *b) {
    if (PairOp[which] && OperatorTwin[which]) {
        int a_expr = (PyObject *)Py_TYPE(a) == ExprType, b_expr = (PyObject *)Py_TYPE(b) == ExprType;
        int slow = 1;
        PyObject *res = NULL;
        if (a_expr && b_expr) {
            PyObject *xs[2] = {a, b};
            res = record_exprs(PairOp[which], xs, 2, EmptyAttrs, Py_None, &slow);
        } else if (a_expr || b_expr) {
            PyObject *c = plain_number(a_expr ? b : a), *attrs = NULL;
            if (c && which == OP_SUB && a_expr)  /* x - c records addc(x, -c), as DyNet */
                Py_SETREF(c, PyNumber_Negative(c));
            if (c)
                attrs = PyTuple_Pack(1, c);
            Py_XDECREF(c);
            if (attrs) {
                PyObject *x = a_expr ? a : b;
                res = record_exprs(a_expr ? ConstOp[which] : RConstOp[which], &x, 1, attrs, Py_None, &slow);
                Py_DECREF(attrs);
            } else if (PyErr_Occurred()) {
                return NULL;
            }
        }
        if (res || !slow)
            return res;
        PyObject *args[2] = {a, b};
        return PyObject_Vectorcall(OperatorTwin[which], args, 2, NULL);
    }
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *expr_add(PyObject *a, PyObject *b) { return expr_operator(OP_ADD, a, b); }
static PyObject *expr_sub(PyObject *a, PyObject *b) { return expr_operator(OP_SUB, a, b); }
static PyObject *expr_mul(PyObject *a, PyObject *b) { return expr_operator(OP_MUL, a, b); }

static PyNumberMethods expr_number = {
    .nb_add = expr_add,
    .nb_subtract = expr_sub,
    .nb_multiply = expr_mul,
};

/* configure_operators(add, addc, sub, rsubc, matmul, mulc, add_twin, sub_twin, mul_twin) */
static PyObject *configure_operators(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *add, *addc, *sub, *rsubc, *matmul, *mulc, *twins[N_OPERATORS];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &add, &addc, &sub, &rsubc, &matmul, &mulc, &twins[0], &twins[1],
                          &twins[2]))
        return NULL;
    for (int k = 0; k < N_OPERATORS; k++)
        if (!PyCallable_Check(twins[k])) {
            PyErr_SetString(PyExc_TypeError, "the operators' twins must be callable");
            return NULL;
        }
    PyObject *pair[N_OPERATORS] = {add, sub, matmul}, *cst[N_OPERATORS] = {addc, addc, mulc},
             *rcst[N_OPERATORS] = {addc, rsubc, mulc};
    for (int k = 0; k < N_OPERATORS; k++) {
        Py_INCREF(pair[k]);
        Py_XSETREF(PairOp[k], pair[k]);
        Py_INCREF(cst[k]);
        Py_XSETREF(ConstOp[k], cst[k]);
        Py_INCREF(rcst[k]);
        Py_XSETREF(RConstOp[k], rcst[k]);
        Py_INCREF(twins[k]);
        Py_XSETREF(OperatorTwin[k], twins[k]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef operator_config = {
    "configure_operators", configure_operators, METH_VARARGS,
    "configure_operators(add, addc, sub, rsubc, matmul, mulc, add_twin, sub_twin, mul_twin): the ops\n"
    "Expression's +, - and * record, and their Python twins (see expr_recorder.c)."};

PyTypeObject ExprBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dynagraph._bookkeeping.ExprBase",
    .tp_basicsize = sizeof(ExprObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A handle to one node of one graph: (cg, i).",
    .tp_dealloc = (destructor)expr_dealloc,
    .tp_members = expr_members,
    .tp_as_number = &expr_number,
    .tp_new = expr_new,
};

/* A new Expression (steals nid). */
static PyObject *make_expr(PyObject *cg, PyObject *nid) {
    if (!nid)
        return NULL;
    PyTypeObject *t = (PyTypeObject *)ExprType;
    ExprObject *e = (ExprObject *)t->tp_alloc(t, 0);
    if (!e) {
        Py_DECREF(nid);
        return NULL;
    }
    Py_INCREF(cg);
    e->cg = cg;
    e->i = nid;
    return (PyObject *)e;
}

/* The live graph of an Expression argument, or NULL (not an Expression, or retired). */
static GraphObject *live_graph(PyObject *x) {
    if ((PyObject *)Py_TYPE(x) != ExprType)
        return NULL;
    PyObject *cg = ((ExprObject *)x)->cg;
    if (!cg || !PyObject_TypeCheck(cg, &GraphBaseType) || ((GraphObject *)cg)->retired)
        return NULL;
    return (GraphObject *)cg;
}

/* ------------------------------------------------------------------- Recorder */
enum { ONE = 1, TWO = 2, LIST = 3, INTS = 4, LIST_INT = 5, INDEX = 6, BARE = 7 };

typedef struct {
    PyObject_HEAD
    PyObject *op;        /* bound op, or NULL: the op is the first call argument */
    PyObject *fallback;  /* called with the same arguments when the fast path does not apply */
    PyObject *attrs;     /* default attrs */
    PyObject *dict;
    PyObject *row_check; /* INDEX: the op's check when it is `0 <= index < shape(x)[0]`, done here */
    vectorcallfunc vectorcall;
    int form;
} RecorderObject;

/* Record from the Expression arguments `xs` (n of them) or return NULL with *slow. */
static PyObject *record_exprs(PyObject *op, PyObject *const *xs, Py_ssize_t n, PyObject *attrs,
                              PyObject *data, int *slow) {
    *slow = 1;
    if (n < 1 || !PyTuple_CheckExact(attrs))
        return NULL;
    Py_ssize_t first = 0;  /* the first expression's graph, as expression.record picks it */
    while (first < n && (PyObject *)Py_TYPE(xs[first]) != ExprType)
        first++;
    GraphObject *g = first < n ? live_graph(xs[first]) : NULL;
    if (!g)
        return NULL;
    PyObject *ids = PyTuple_New(n);
    if (!ids) {
        *slow = 0;
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = xs[k], *nid;
        if ((PyObject *)Py_TYPE(x) == ExprType && ((ExprObject *)x)->cg == (PyObject *)g && ((ExprObject *)x)->i) {
            nid = ((ExprObject *)x)->i;
            Py_INCREF(nid);
        } else if (dg_is_parameter_object(x)) {
            /* DyNet 2's idiom, a parameter given where an expression goes (affine_transform([b, W, x])):
               its leaf in order, as _arg_id makes it; anything unusual goes to Python, which makes
               the leaves the same way and words any error */
            int leaf_slow;
            nid = dg_graph_leaf((PyObject *)g, x, 1, &leaf_slow);
            if (!nid) {
                Py_DECREF(ids);
                if (!leaf_slow)
                    *slow = 0;
                return NULL;
            }
        } else {
            Py_DECREF(ids);
            return NULL;
        }
        PyTuple_SET_ITEM(ids, k, nid);
    }
    *slow = 0;
    PyObject *nid = dg_graph_add((PyObject *)g, op, ids, attrs, data);
    Py_DECREF(ids);
    return make_expr((PyObject *)g, nid);
}

/* f(x, i): data i (a class index), attrs the default. When the op's check is r->row_check
   (`0 <= i < shape(x)[0]`, checked here), it is not run again in Python; an index out of
   range records through the op's check, which raises the worded error. */
static PyObject *record_index(RecorderObject *r, PyObject *op, PyObject *x, PyObject *i, int *slow) {
    *slow = 1;
    GraphObject *g = live_graph(x);
    if (!g || !((ExprObject *)x)->i || !PyTuple_CheckExact(r->attrs))
        return NULL;
    PyObject *checked = NULL;
    if (r->row_check && g->shape && PyList_CheckExact(g->shape)) {
        Py_ssize_t n = PyLong_AsSsize_t(((ExprObject *)x)->i);
        PyObject *shape = n >= 0 && n < PyList_GET_SIZE(g->shape) ? PyList_GET_ITEM(g->shape, n) : NULL;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
        if (PyErr_Occurred())
            PyErr_Clear();
        else if (shape && PyTuple_CheckExact(shape) && PyTuple_GET_SIZE(shape) >= 1 && !overflow && v >= 0 &&
                 v < PyLong_AsLongLong(PyTuple_GET_ITEM(shape, 0)))
            checked = r->row_check;
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    PyObject *ids = PyTuple_Pack(1, ((ExprObject *)x)->i);
    *slow = 0;
    if (!ids)
        return NULL;
    PyObject *nid = checked ? dg_graph_add_checked((PyObject *)g, op, ids, r->attrs, i, checked)
                            : dg_graph_add((PyObject *)g, op, ids, r->attrs, i);
    Py_DECREF(ids);
    return make_expr((PyObject *)g, nid);
}

/* f(x, i, j, ...): the ints fill attrs' prefix, the rest keep their defaults (None: required);
   anything but exact ints goes to the fallback (*slow stays 1). */
static PyObject *record_ints(RecorderObject *r, PyObject *op, PyObject *const *a, Py_ssize_t na, int *slow) {
    Py_ssize_t K = PyTuple_GET_SIZE(r->attrs);
    PyObject *at = PyTuple_New(K);
    if (!at) {
        *slow = 0;
        return NULL;
    }
    int ok = 1;
    for (Py_ssize_t k = 0; k < K && ok; k++) {
        PyObject *v = k < na - 1 ? a[1 + k] : PyTuple_GET_ITEM(r->attrs, k);
        ok = PyLong_CheckExact(v);
        Py_INCREF(v);
        PyTuple_SET_ITEM(at, k, v);
    }
    PyObject *res = ok ? record_exprs(op, a, 1, at, Py_None, slow) : NULL;
    Py_DECREF(at);
    return res;
}

/* f([x, ...], d): attrs (d,), d an exact int (the default attrs when d is omitted or equal);
   anything else goes to the fallback (*slow stays 1). */
static PyObject *record_list_int(RecorderObject *r, PyObject *op, PyObject *const *a, Py_ssize_t na, int *slow) {
    PyObject *at = r->attrs;
    if (na == 2 && a[1] != PyTuple_GET_ITEM(at, 0)) {
        if (!PyLong_CheckExact(a[1]))
            return NULL;
        if (!(at = PyTuple_Pack(1, a[1]))) {
            *slow = 0;
            return NULL;
        }
    } else {
        Py_INCREF(at);
    }
    PyObject *xs = a[0];  /* the list may change under a call into Python: hold it */
    Py_INCREF(xs);
    PyObject *res = record_exprs(op, &PyList_GET_ITEM(xs, 0), PyList_GET_SIZE(xs), at, Py_None, slow);
    Py_DECREF(xs);
    Py_DECREF(at);
    return res;
}

static PyObject *recorder_call(RecorderObject *r, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames && PyTuple_GET_SIZE(kwnames))
        goto slow;
    PyObject *op = r->op;
    PyObject *const *a = argv;
    Py_ssize_t na = nargs;
    if (!op) {
        if (na < 1)
            goto slow;
        op = a[0];
        a++;
        na--;
    }
    int slow = 1;
    PyObject *res = NULL;
    if (r->form == ONE && na >= 1 && na <= 3) {
        res = record_exprs(op, a, 1, na > 1 ? a[1] : r->attrs, na > 2 ? a[2] : Py_None, &slow);
    } else if (r->form == TWO && (na == 2 || na == 3)) {
        res = record_exprs(op, a, 2, na > 2 ? a[2] : r->attrs, Py_None, &slow);
    } else if (r->form == INTS && na >= 1 && na - 1 <= PyTuple_GET_SIZE(r->attrs)) {
        res = record_ints(r, op, a, na, &slow);
    } else if (r->form == LIST_INT && (na == 1 || na == 2) && PyList_CheckExact(a[0]) &&
               PyTuple_GET_SIZE(r->attrs) == 1) {
        res = record_list_int(r, op, a, na, &slow);
    } else if (r->form == BARE && na == 1) {  /* f(x): the default attrs; any other call: the fallback */
        res = record_exprs(op, a, 1, r->attrs, Py_None, &slow);
    } else if (r->form == INDEX && na == 2 && PyLong_CheckExact(a[1])) {
        res = record_index(r, op, a[0], a[1], &slow);
    } else if (r->form == LIST && (na == 1 || na == 2) && PyList_CheckExact(a[0])) {
        /* the list may change under a call into Python: hold it */
        PyObject *xs = a[0];
        Py_INCREF(xs);
        res = record_exprs(op, &PyList_GET_ITEM(xs, 0), PyList_GET_SIZE(xs), na > 1 ? a[1] : r->attrs,
                           Py_None, &slow);
        Py_DECREF(xs);
    }
    if (res || !slow)
        return res;
slow:
    return PyObject_Vectorcall(r->fallback, argv, nargsf, kwnames);
}

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *op, *fallback, *attrs = NULL, *row_check = NULL;
    int form;
    static char *names[] = {"op", "form", "fallback", "attrs", "row_check", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiO|O!O", names, &op, &form, &fallback, &PyTuple_Type, &attrs,
                                     &row_check))
        return NULL;
    if (form < ONE || form > BARE) {
        PyErr_SetString(PyExc_ValueError, "form must be 1 (one expression), 2 (two), 3 (a list), 4 (an "
                                          "expression and ints), 5 (a list and an int), 6 (an expression and "
                                          "an index) or 7 (one expression alone)");
        return NULL;
    }
    if ((form == LIST_INT || form == INDEX || form == BARE) && op == Py_None) {
        PyErr_SetString(PyExc_ValueError, "forms 5, 6 and 7 need their op");
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    RecorderObject *r = (RecorderObject *)type->tp_alloc(type, 0);
    if (!r)
        return NULL;
    r->op = op == Py_None ? NULL : op;
    Py_XINCREF(r->op);
    Py_INCREF(fallback);
    r->fallback = fallback;
    r->attrs = attrs ? attrs : PyTuple_New(0);
    if (attrs)
        Py_INCREF(attrs);
    r->form = form;
    r->row_check = row_check == Py_None ? NULL : row_check;
    Py_XINCREF(r->row_check);
    r->vectorcall = (vectorcallfunc)recorder_call;
    if (!r->attrs) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int recorder_traverse(RecorderObject *r, visitproc visit, void *arg) {
    Py_VISIT(r->op);
    Py_VISIT(r->fallback);
    Py_VISIT(r->attrs);
    Py_VISIT(r->dict);
    Py_VISIT(r->row_check);
    return 0;
}

static int recorder_clear(RecorderObject *r) {
    Py_CLEAR(r->op);
    Py_CLEAR(r->fallback);
    Py_CLEAR(r->attrs);
    Py_CLEAR(r->dict);
    Py_CLEAR(r->row_check);
    return 0;
}

static void recorder_dealloc(RecorderObject *r) {
    PyObject_GC_UnTrack(r);
    recorder_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *recorder_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);  /* a method when stored on a class, like a function */
}

static PyMemberDef recorder_members[] = {
    {"fallback", T_OBJECT, offsetof(RecorderObject, fallback), READONLY, "called when an argument is not a live Expression"},
    {"form", T_INT, offsetof(RecorderObject, form), READONLY,
     "1: f(x), 2: f(x, y), 3: f([x, ...]), 4: f(x, i, ...), 5: f([x, ...], d), 6: f(x, index), 7: f(x)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef recorder_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dynagraph._bookkeeping.Recorder",
    .tp_basicsize = sizeof(RecorderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Recorder(op, form, fallback, attrs=()): records `op` from Expression arguments\n"
              "(op=None: the op is the first argument), else calls fallback(*args).",
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_members = recorder_members,
    .tp_getset = recorder_getset,
    .tp_dictoffset = offsetof(RecorderObject, dict),
    .tp_vectorcall_offset = offsetof(RecorderObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = recorder_get,
    .tp_new = recorder_new,
};

/* --------------------------------------------------------------------- module */
PyObject *ExprType = NULL;  /* Expression (a Python subclass of ExprBase) */

PyObject *dg_configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *expr, *slot, *key, *shapes = NULL, *draw = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O|O!O", &PyType_Type, &expr, &PyType_Type, &slot, &key, &PyDict_Type, &shapes,
                          &draw))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)expr, &ExprBaseType) ||
        ((PyTypeObject *)expr)->tp_basicsize != ExprBaseType.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "Expression must subclass ExprBase and add no fields (__slots__ = ())");
        return NULL;
    }
    Py_INCREF(expr);
    Py_XSETREF(ExprType, expr);
    dg_graph_configure(slot, key, shapes, draw);
    Py_RETURN_NONE;
}

/* plain_expression_type(cls): cls, a class statement's subclass of ExprBase that adds no
   fields, made again from a spec over ExprBase, so that its instances are not GC objects
   (see expr_dealloc); its namespace (methods, properties, constants, dunders, which set their
   slots) is copied onto the new type. Methods must not use super() or __class__: their cell
   would name cls. */
static const char *const NOT_COPIED[] = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                                         "__slots__", NULL};

static int copied(PyObject *key) {
    if (!PyUnicode_Check(key))
        return 0;
    for (int k = 0; NOT_COPIED[k]; k++)
        if (PyUnicode_CompareWithASCIIString(key, NOT_COPIED[k]) == 0)
            return 0;
    return 1;
}

PyObject *dg_plain_expression_type(PyObject *self, PyObject *cls) {
    (void)self;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &ExprBaseType) ||
        ((PyTypeObject *)cls)->tp_basicsize != ExprBaseType.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "plain_expression_type(cls): cls must subclass ExprBase and add no "
                                         "fields (__slots__ = ())");
        return NULL;
    }
    PyObject *module = PyObject_GetAttrString(cls, "__module__"), *qualname = PyObject_GetAttrString(cls, "__qualname__");
    PyObject *name = module && qualname ? PyUnicode_FromFormat("%U.%U", module, qualname) : NULL;
    const char *tp_name = name ? PyUnicode_AsUTF8(name) : NULL;  /* copied by PyType_FromSpec */
    PyObject *tp = NULL;
    if (tp_name) {
        PyType_Slot slots[] = {{Py_tp_dealloc, (void *)expr_heap_dealloc}, {0, NULL}};
        PyType_Spec spec = {tp_name, (int)ExprBaseType.tp_basicsize, 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                            slots};
        tp = PyType_FromSpecWithBases(&spec, (PyObject *)&ExprBaseType);
    }
    PyObject *ns = tp ? PyObject_GetAttrString(cls, "__dict__") : NULL;  /* a mappingproxy */
    PyObject *items = ns ? PyMapping_Items(ns) : NULL;
    for (Py_ssize_t k = 0; items && k < PyList_GET_SIZE(items); k++) {
        PyObject *kv = PyList_GET_ITEM(items, k);
        if (copied(PyTuple_GET_ITEM(kv, 0)) && PyObject_SetAttr(tp, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1)) < 0)
            Py_CLEAR(items);
    }
    PyObject *doc = items ? PyObject_GetAttrString(cls, "__doc__") : NULL;
    if (!doc || PyObject_SetAttrString(tp, "__doc__", doc) < 0 || PyObject_SetAttrString(tp, "__qualname__", qualname) < 0)
        Py_CLEAR(tp);
    Py_XDECREF(doc);
    Py_XDECREF(items);
    Py_XDECREF(ns);
    Py_XDECREF(name);
    Py_XDECREF(qualname);
    Py_XDECREF(module);
    return tp;
}

/* ------------------------------------------------- for leaves.c (bookkeeping.h) */
int dg_recorder_ready(void) {
    return ExprType != NULL;
}

PyObject *dg_make_expr(PyObject *cg, PyObject *nid) {
    return make_expr(cg, nid);
}

/* ExprBase and Recorder into the module (module.c calls it after recorder.c's GraphBase) */
int dg_expr_add_types(PyObject *m) {
    if (PyType_Ready(&ExprBaseType) < 0 || PyType_Ready(&RecorderType) < 0)
        return -1;
    if (!EmptyAttrs && !(EmptyAttrs = PyTuple_New(0)))
        return -1;
    PyObject *f = PyCFunction_NewEx(&operator_config, NULL, NULL);
    if (!f || PyModule_AddObject(m, "configure_operators", f) < 0) {
        Py_XDECREF(f);
        return -1;
    }
    PyTypeObject *types[2] = {&ExprBaseType, &RecorderType};
    const char *names[2] = {"ExprBase", "Recorder"};
    for (int k = 0; k < 2; k++) {
        Py_INCREF(types[k]);
        if (PyModule_AddObject(m, names[k], (PyObject *)types[k]) < 0) {
            Py_DECREF(types[k]);
            return -1;
        }
    }
    return 0;
}
