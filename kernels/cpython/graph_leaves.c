/* Parameter leaves of a graph (part of dynagraph._bookkeeping; see recorder.c): GraphBase.leaf
and dg_graph_leaf, which leaves.c's dy.parameter / dy.lookup / E[i] use. */
#include "recorder.h"

#define LIST_OR_SLOW(x) do { if (!(x) || !PyList_CheckExact(x)) return 0; } while (0)

/* ComputationGraph._leaf_py is the reference: a parameter's leaf node is made once per graph
   (and mode), the first time the parameter is used in it, which is several times per
   sentence in a per-sentence program. Here it is made without a Python frame when the
   parameter is an ordinary one (its storage, updated flag and signature parts in its
   __dict__, as parameters._Stored sets them); anything else is Python's. */
static PyObject *ParameterOp = NULL, *TableOp = NULL;  /* ops.inputs.PARAMETER, LOOKUP_TABLE */
static PyObject *StorageName, *UpdatedName, *SigPartsName, *IsLookupName, *ShapeName, *LeafPyName, *LeafViewName,
    *ReshapeName;
static PyObject *MinusOne, *Zero, *NoArgs;

int dg_leaves_configure(PyObject *parameter_op, PyObject *table_op) {
    Py_INCREF(parameter_op);
    Py_INCREF(table_op);
    Py_XSETREF(ParameterOp, parameter_op);
    Py_XSETREF(TableOp, table_op);
    return 0;
}

/* The parameter classes (exact) whose objects record_exprs (expr_recorder.c) binds as leaves
   when one is given where an expression goes, as expression._arg_id does with cg.leaf(x); set by
   leaves.c's configure_entries. */
static PyObject *ParamClass = NULL, *TableClass = NULL;

void dg_parameter_types(PyObject *params, PyObject *table) {
    Py_INCREF(params);
    Py_INCREF(table);
    Py_XSETREF(ParamClass, params);
    Py_XSETREF(TableClass, table);
}

int dg_is_parameter_object(PyObject *x) {
    PyObject *t = (PyObject *)Py_TYPE(x);
    return ParamClass && (t == ParamClass || t == TableClass);
}

static inline int leaf_columns_ready(GraphObject *g) {
    LIST_OR_SLOW(g->blk); LIST_OR_SLOW(g->row); LIST_OR_SLOW(g->blocks);
    return g->block_param && PyDict_CheckExact(g->block_param) && g->leaves && PyDict_CheckExact(g->leaves);
}

/* values.reshape((1,) + shape), ops.base.one_row: the block of one row with C strides (values[None]
   gives its new axis stride 0, and every buffer export of such a block then went through numpy's
   protocol instead of array_view.c's direct view). A new reference, or NULL. */
static PyObject *one_row(PyObject *values, PyObject *shape) {
    Py_ssize_t k = PyTuple_GET_SIZE(shape);
    PyObject *shape1 = PyTuple_New(k + 1);
    if (!shape1)
        return NULL;
    PyTuple_SET_ITEM(shape1, 0, PyLong_FromLong(1));
    for (Py_ssize_t i = 0; i < k; i++)
        PyTuple_SET_ITEM(shape1, i + 1, Py_NewRef(PyTuple_GET_ITEM(shape, i)));
    PyObject *view = PyTuple_GET_ITEM(shape1, 0) ? PyObject_CallMethodOneArg(values, ReshapeName, shape1) : NULL;
    Py_DECREF(shape1);
    return view;
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
    /* (storage, one_row(storage), its shape) as the last graph made them, while the storage is
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
            lp->view = one_row(values, lp->shape);
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
        if (dg_col_append(g->blk, MinusOne) < 0 || dg_col_append(g->row, Zero) < 0)
            return -1;
    PyObject *b = PyLong_FromSsize_t(PyList_GET_SIZE(g->blocks));
    if (!b)
        return -1;
    int rc = -1;
    PyObject *attrs = PyTuple_Pack(2, lp->shape, p);
    if (attrs && dg_col_append(g->op, lp->table ? TableOp : ParameterOp) == 0 && dg_col_append(g->args, NoArgs) == 0 &&
        dg_col_append(g->attrs, attrs) == 0 && dg_col_append(g->data, Py_None) == 0 &&
        dg_col_append(g->shape, lp->shape) == 0 && dg_col_append(g->depth, Zero) == 0 &&
        dg_col_append(g->sig, MinusOne) == 0 && dg_col_append(g->sig_part, lp->part) == 0 &&
        dg_col_append(g->needs_grad, update && lp->trained ? Py_True : Py_False) == 0 &&
        PyDict_SetItem(g->block_param, b, p) == 0 && dg_col_append(g->blk, b) == 0 &&
        dg_col_append(g->row, Zero) == 0 && dg_col_append(g->blocks, lp->view) == 0 &&
        PyDict_SetItem(g->leaves, key, nid) == 0) {
        rc = 0;
        dg_table_push(g, n, NoArgs, NULL);
    }
    Py_XDECREF(attrs);
    Py_DECREF(b);
    return rc;
}

PyObject *dg_graph_leaf(PyObject *cg, PyObject *p, int update, int *slow) {
    *slow = 1;
    if (!ParameterOp || !PyObject_TypeCheck(cg, &GraphBaseType))
        return NULL;
    GraphObject *g = (GraphObject *)cg;
    if (!dg_columns_ready(g) || !leaf_columns_ready(g))
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
    if (!dg_columns_ready(g) || !leaf_columns_ready(g) ||
        PyDict_Contains(g->leaves, key) != 0) {  /* Python code ran meanwhile: let it decide */
        *slow = !PyErr_Occurred();
        leaf_parts_clear(&lp);
        Py_DECREF(key);
        return NULL;
    }
    nid = dg_int(PyList_GET_SIZE(g->op));
    if (nid && append_leaf(g, p, key, nid, &lp, update) < 0)
        Py_CLEAR(nid);
    leaf_parts_clear(&lp);
    Py_DECREF(key);
    return nid;
}

/* leaf(p, update=True) -> node id (see ComputationGraph._leaf_py) */
static PyObject *graph_leaf_method(GraphObject *g, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
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
    const char *names[8] = {"_values_storage", "_updated", "_sig_parts", "is_lookup", "shape", "_leaf_py",
                            "_leaf_view", "reshape"};
    PyObject **slots[8] = {&StorageName, &UpdatedName, &SigPartsName, &IsLookupName, &ShapeName, &LeafPyName,
                           &LeafViewName, &ReshapeName};
    for (int k = 0; k < 8; k++)
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

static PyMethodDef leaf_method = {
    "leaf", (PyCFunction)(void (*)(void))graph_leaf_method, METH_FASTCALL | METH_KEYWORDS,
    "leaf(p, update=True) -> node id. The node of parameter p in this graph (see ComputationGraph._leaf_py)."};

/* GraphBase.leaf, added to the type recorder.c made ready (after dg_recorder_add_types): this
   file builds on the recorder, which does not know it. 0 or -1. */
int dg_graph_leaves_add(void) {
    if (leaf_names() < 0)
        return -1;
    PyObject *descr = PyDescr_NewMethod(&GraphBaseType, &leaf_method);
    if (!descr)
        return -1;
    int rc = PyDict_SetItemString(GraphBaseType.tp_dict, "leaf", descr);
    Py_DECREF(descr);
    PyType_Modified(&GraphBaseType);
    return rc;
}
