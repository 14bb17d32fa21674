/* kernels/cpython/block_call.c: the hot path of a dy.block call (dynagraph/subgraph.py,
 * Block.__call__), compiled. Per-sample code calls a block thousands of times per graph;
 * the Python body (one pass over the arguments, the plan lookup, the parameter ids, the
 * coarse node and its output views) was ~1.6 us a call, most of a blocked TreeLSTM's
 * recording. This does the common case and returns None for anything else (a new argument
 * signature to trace, numpy integers, expressions of several graphs, a retired graph,
 * random steps), which Block._call_py then handles, so both paths end in the same graph.
 *
 * block_configure(Expression, current, BLOCK_OUTPUT) once; then calling a Block (its base
 * type BlockCall, below) runs block_call_core(plans, args, share) -> the outputs, or None.
 * A plan carries `_fast` = (op, has_checks, checked, by_index, direct, single, out_attrs,
 * random) (subgraph.Plan.set_mode), `_calls` = [version, reverts, {indices: node ids}] and
 * `_leaf_cache` = (version, reverts, parameter node ids) or None (refreshed by leaf_ids). */
#include "coarsen.h"

typedef struct {
    PyObject_HEAD
    PyObject *cg, *i;
} BlockExprObject; /* the layout of recorder.h's ExprObject (checked against the configured type) */

enum { MAX_CALL_ARGS = 16 };

static PyObject *expr_type, *current_fn, *block_output_op;
static PyObject *s_fast, *s_calls, *s_leaf_cache, *s_leaf_ids, *s_check, *s_add, *s_retired, *s_version,
    *s_reverts, *s_shape, *s_index, *empty_tuple;

PyObject *dgc_block_configure(PyObject *self, PyObject *a) {
    (void)self;
    PyObject *et, *cur, *bo;
    if (!PyArg_ParseTuple(a, "OOO", &et, &cur, &bo)) return NULL;
    if (!PyType_Check(et) || ((PyTypeObject *)et)->tp_basicsize != (Py_ssize_t)sizeof(BlockExprObject)) {
        PyErr_SetString(PyExc_TypeError, "block_configure: Expression must be a type laid out as (cg, i)");
        return NULL;
    }
    Py_XSETREF(expr_type, Py_NewRef(et));
    Py_XSETREF(current_fn, Py_NewRef(cur));
    Py_XSETREF(block_output_op, Py_NewRef(bo));
#define INTERN(v, s) if (!v && !(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_fast, "_fast"); INTERN(s_calls, "_calls"); INTERN(s_leaf_cache, "_leaf_cache");
    INTERN(s_leaf_ids, "leaf_ids"); INTERN(s_check, "check"); INTERN(s_add, "add");
    INTERN(s_retired, "retired"); INTERN(s_version, "version"); INTERN(s_reverts, "reverts");
    INTERN(s_shape, "shape"); INTERN(s_index, "index");
#undef INTERN
    if (!empty_tuple && !(empty_tuple = PyTuple_New(0))) return NULL;
    Py_RETURN_NONE;
}

/* Expression(cg, nid) without the type call: its __new__ parses an argument tuple (~800
 * instructions; two or three of these a call). block_configure checked the layout, and
 * Expression adds no __init__. */
static PyObject *new_expr(PyObject *cg, PyObject *nid) {
    PyTypeObject *t = (PyTypeObject *)expr_type;
    BlockExprObject *e = (BlockExprObject *)t->tp_alloc(t, 0);
    if (!e) return NULL;
    e->cg = Py_NewRef(cg);
    e->i = Py_NewRef(nid);
    return (PyObject *)e;
}

/* The outputs of node ids `nids` (an int, or a tuple of them) as the call returns them. */
static PyObject *outputs_of(PyObject *cg, PyObject *nids, int single) {
    if (PyLong_Check(nids)) {
        PyObject *e = new_expr(cg, nids);
        if (!e || single) return e;
        PyObject *t = PyTuple_Pack(1, e);
        Py_DECREF(e);
        return t;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(nids);
    if (single && n == 1) return new_expr(cg, PyTuple_GET_ITEM(nids, 0));
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t k = 0; t && k < n; k++) {
        PyObject *e = new_expr(cg, PyTuple_GET_ITEM(nids, k));
        if (!e) { Py_CLEAR(t); break; }
        PyTuple_SET_ITEM(t, k, e);
    }
    if (t && single) {  /* one output reached through a view: the call returns it alone */
        PyObject *e = Py_NewRef(PyTuple_GET_ITEM(t, 0));
        Py_DECREF(t);
        return e;
    }
    return t;
}

static PyObject *graph_add(PyObject *cg, PyObject *op, PyObject *args, PyObject *attrs, PyObject *data) {
    PyObject *a[5] = {cg, op, args, attrs, data};
    return PyObject_VectorcallMethod(s_add, a, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* 1 if the memo list [version, reverts, dict] is this graph's, 0 if not, -1 on error. */
static int memo_current(PyObject *calls, PyObject *version, PyObject *reverts) {
    if (!PyList_Check(calls) || PyList_GET_SIZE(calls) != 3) return 0;
    int v = PyObject_RichCompareBool(PyList_GET_ITEM(calls, 0), version, Py_EQ);
    if (v <= 0) return v;
    return PyObject_RichCompareBool(PyList_GET_ITEM(calls, 1), reverts, Py_EQ);
}

/* Record the coarse node (and its output views); the node ids as memo stores them in *nids. */
static PyObject *record_call(PyObject *plan, PyObject *fast, PyObject *cg, PyObject *const *ids, Py_ssize_t nids_in,
                             PyObject *values, PyObject *version, PyObject *reverts, PyObject **nids) {
    PyObject *result = NULL, *leaf_ids = NULL, *argids = NULL, *nid = NULL, *views = NULL;
    PyObject *lc = PyObject_GetAttr(plan, s_leaf_cache);
    if (!lc) return NULL;
    int fresh = 0;
    if (PyTuple_Check(lc) && PyTuple_GET_SIZE(lc) == 3) {
        fresh = PyObject_RichCompareBool(PyTuple_GET_ITEM(lc, 0), version, Py_EQ);
        if (fresh > 0) fresh = PyObject_RichCompareBool(PyTuple_GET_ITEM(lc, 1), reverts, Py_EQ);
        if (fresh < 0) goto done;
    }
    if (fresh) {
        leaf_ids = Py_NewRef(PyTuple_GET_ITEM(lc, 2));
    } else {
        PyObject *a[2] = {plan, cg};
        leaf_ids = PyObject_VectorcallMethod(s_leaf_ids, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (!leaf_ids) goto done;
    }
    if (!PyTuple_Check(leaf_ids)) { PyErr_SetString(PyExc_TypeError, "block_call: leaf ids must be a tuple"); goto done; }
    Py_ssize_t nl = PyTuple_GET_SIZE(leaf_ids);
    if (!(argids = PyTuple_New(nids_in + nl))) goto done;
    for (Py_ssize_t k = 0; k < nids_in; k++) PyTuple_SET_ITEM(argids, k, Py_NewRef(ids[k]));
    for (Py_ssize_t k = 0; k < nl; k++) PyTuple_SET_ITEM(argids, nids_in + k, Py_NewRef(PyTuple_GET_ITEM(leaf_ids, k)));
    if (!(nid = graph_add(cg, PyTuple_GET_ITEM(fast, 0), argids, empty_tuple, values))) goto done;
    int direct = PyObject_IsTrue(PyTuple_GET_ITEM(fast, 4)), single = PyObject_IsTrue(PyTuple_GET_ITEM(fast, 5));
    if (direct < 0 || single < 0) goto done;
    if (direct) {
        *nids = Py_NewRef(nid);
    } else {
        PyObject *attrs = PyTuple_GET_ITEM(fast, 6);
        Py_ssize_t m = PyTuple_GET_SIZE(attrs);
        PyObject *src = PyTuple_Pack(1, nid);
        if (!src || !(views = PyTuple_New(m))) { Py_XDECREF(src); goto done; }
        for (Py_ssize_t k = 0; k < m; k++) {
            PyObject *v = graph_add(cg, block_output_op, src, PyTuple_GET_ITEM(attrs, k), Py_None);
            if (!v) { Py_DECREF(src); goto done; }
            PyTuple_SET_ITEM(views, k, v);
        }
        Py_DECREF(src);
        *nids = Py_NewRef(views);
    }
    result = outputs_of(cg, *nids, single);
    if (!result) Py_CLEAR(*nids);
done:
    Py_XDECREF(lc); Py_XDECREF(leaf_ids); Py_XDECREF(argids); Py_XDECREF(nid); Py_XDECREF(views);
    return result;
}

/* The plan key of `args` (each expression's node shape, `index` for each int) in *key, the
 * expressions' node ids in ids[*nids], their graph (borrowed) in *cg and its shapes in *shapes.
 * 1: done, 0: a case for the Python path, -1: error. */
static int call_key(PyObject *args, PyObject **ids, Py_ssize_t *nids, Py_ssize_t *nvals, PyObject **cg,
                    PyObject **shapes, PyObject **key) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (!(*key = PyTuple_New(n))) return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = PyTuple_GET_ITEM(args, k);
        if (Py_TYPE(x) == (PyTypeObject *)expr_type) {
            BlockExprObject *e = (BlockExprObject *)x;
            if (*cg == NULL) {
                *cg = e->cg;
                if (!(*shapes = PyObject_GetAttr(*cg, s_shape))) return -1;  /* the graph's per-node shapes */
                if (!PyList_Check(*shapes)) return 0;
            } else if (e->cg != *cg) {
                return 0;
            }
            Py_ssize_t i = PyLong_AsSsize_t(e->i);
            if (i == -1 && PyErr_Occurred()) return -1;
            if (i < 0 || i >= PyList_GET_SIZE(*shapes)) return 0;
            PyTuple_SET_ITEM(*key, k, Py_NewRef(PyList_GET_ITEM(*shapes, i)));
            ids[(*nids)++] = e->i;
        } else if (PyLong_CheckExact(x)) {
            PyTuple_SET_ITEM(*key, k, Py_NewRef(s_index));
            (*nvals)++;
        } else {
            return 0;
        }
    }
    return 1;
}

/* The call's int arguments (nvals of them), in order. */
static PyObject *int_args(PyObject *args, Py_ssize_t nvals) {
    PyObject *values = PyTuple_New(nvals);
    if (!values) return NULL;
    for (Py_ssize_t k = 0, v = 0; k < PyTuple_GET_SIZE(args); k++) {
        PyObject *x = PyTuple_GET_ITEM(args, k);
        if (PyLong_CheckExact(x)) PyTuple_SET_ITEM(values, v++, Py_NewRef(x));
    }
    return values;
}

/* The plan's `_fast` tuple in *fast and its flags. 1: usable, 0: the Python path (random steps,
 * an unexpected mode), -1: error. */
static int plan_fast(PyObject *plan, PyObject **fast, int *by_index, int *checks) {
    if (!(*fast = PyObject_GetAttr(plan, s_fast))) return -1;
    if (!PyTuple_Check(*fast) || PyTuple_GET_SIZE(*fast) != 8) return 0;
    int random = PyObject_IsTrue(PyTuple_GET_ITEM(*fast, 7));
    *by_index = PyObject_IsTrue(PyTuple_GET_ITEM(*fast, 3));
    *checks = PyObject_IsTrue(PyTuple_GET_ITEM(*fast, 1));
    if (random < 0 || *by_index < 0 || *checks < 0) return -1;
    return !random;
}

/* The graph's version and reverts. 1: a live graph, 0: retired (the Python path raises), -1: error. */
static int graph_state(PyObject *cg, PyObject **version, PyObject **reverts) {
    PyObject *ret = PyObject_GetAttr(cg, s_retired);
    if (!ret) return -1;
    int retired = PyObject_IsTrue(ret);
    Py_DECREF(ret);
    if (retired) return retired < 0 ? -1 : 0;
    if (!(*version = PyObject_GetAttr(cg, s_version)) || !(*reverts = PyObject_GetAttr(cg, s_reverts))) return -1;
    return 1;
}

/* The plan's memo list in *calls and, where this graph already made the call with `values`, its
 * outputs in *result (left NULL otherwise). 0, or -1 on error. */
static int memo_lookup(PyObject *plan, PyObject *fast, PyObject *cg, PyObject *values, PyObject *version,
                       PyObject *reverts, PyObject **calls, PyObject **result) {
    if (!(*calls = PyObject_GetAttr(plan, s_calls))) return -1;
    int cur = memo_current(*calls, version, reverts);
    if (cur <= 0) return cur;
    PyObject *hit = PyDict_GetItemWithError(PyList_GET_ITEM(*calls, 2), values);
    if (!hit) return PyErr_Occurred() ? -1 : 0;
    int single = PyObject_IsTrue(PyTuple_GET_ITEM(fast, 5));
    if (single < 0) return -1;
    *result = outputs_of(cg, hit, single);
    return *result ? 0 : -1;
}

/* Values outside the plan's checked set go through Plan.check, which raises the user-facing error
 * or remembers them. 0, or -1 on error. */
static int check_values(PyObject *plan, PyObject *fast, PyObject *values) {
    int ok = PySet_Contains(PyTuple_GET_ITEM(fast, 2), values);
    if (ok) return ok < 0 ? -1 : 0;
    PyObject *ca[2] = {plan, values};
    PyObject *r = PyObject_VectorcallMethod(s_check, ca, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* Remember the call's node ids `stored` under `values` in the plan's memo (*calls, replaced by a
 * fresh memo on this graph's first call of the plan). 0, or -1 on error. */
static int memo_store(PyObject *plan, PyObject **calls, PyObject *version, PyObject *reverts, PyObject *values,
                      PyObject *stored) {
    int cur = memo_current(*calls, version, reverts);
    if (cur < 0) return -1;
    if (!cur) {
        PyObject *d = PyDict_New();
        PyObject *fresh = d ? PyList_New(3) : NULL;
        if (!fresh) { Py_XDECREF(d); return -1; }
        PyList_SET_ITEM(fresh, 0, Py_NewRef(version));
        PyList_SET_ITEM(fresh, 1, Py_NewRef(reverts));
        PyList_SET_ITEM(fresh, 2, d);
        int bad = PyObject_SetAttr(plan, s_calls, fresh);
        Py_SETREF(*calls, fresh);
        if (bad) return -1;
    }
    return PyDict_SetItem(PyList_GET_ITEM(*calls, 2), values, stored);
}

/* A block call's body (BlockCall's call): the call's outputs, None for the Python path's cases, NULL on error. */
static PyObject *block_call_core(PyObject *plans, PyObject *args, int share) {
    if (PyTuple_GET_SIZE(args) > MAX_CALL_ARGS) Py_RETURN_NONE;
    PyObject *ids[MAX_CALL_ARGS];
    Py_ssize_t nids = 0, nvals = 0;
    PyObject *cg = NULL, *result = NULL, *key = NULL, *values = NULL, *fast = NULL, *cgref = NULL, *shapes = NULL;
    PyObject *version = NULL, *reverts = NULL, *calls = NULL, *stored = NULL, *plan = NULL;
    int by_index = 0, checks = 0, memo = 0;
    /* st: 1 going on, 0 the Python path's case (returns None), -1 error */
    int st = call_key(args, ids, &nids, &nvals, &cg, &shapes, &key);
    if (st <= 0) goto done;
    plan = PyDict_GetItemWithError(plans, key);  /* borrowed */
    if (!plan) { st = PyErr_Occurred() ? -1 : 0; goto done; }
    Py_INCREF(plan);
    if (!(values = int_args(args, nvals))) { st = -1; goto done; }
    if ((st = plan_fast(plan, &fast, &by_index, &checks)) <= 0) goto done;
    if (cg == NULL && !(cg = cgref = PyObject_CallNoArgs(current_fn))) { st = -1; goto done; }
    if ((st = graph_state(cg, &version, &reverts)) <= 0) goto done;
    memo = by_index && share;
    if (memo && memo_lookup(plan, fast, cg, values, version, reverts, &calls, &result) < 0) { st = -1; goto done; }
    if (result) goto done;  /* memoised: this graph already made this call */
    if (checks && check_values(plan, fast, values) < 0) { st = -1; goto done; }
    result = record_call(plan, fast, cg, ids, nids, values, version, reverts, &stored);
    if (result && memo && memo_store(plan, &calls, version, reverts, values, stored) < 0) Py_CLEAR(result);
done:
    if (st == 0) result = Py_NewRef(Py_None);
    Py_XDECREF(key); Py_XDECREF(values); Py_XDECREF(fast); Py_XDECREF(cgref); Py_XDECREF(shapes);
    Py_XDECREF(version); Py_XDECREF(reverts); Py_XDECREF(calls); Py_XDECREF(stored); Py_XDECREF(plan);
    return result;
}

/* BlockCall, the base type of subgraph.Block: calling a block runs the compiled path with no
 * Python frame (a frame and a bound-method call were ~2,000 instructions of each call) and
 * falls back to the instance's `_call_py(args)` for the cases it leaves. */
static PyObject *s_plans, *s_share, *s_call_py;

static PyObject *block_tp_call(PyObject *self, PyObject *args, PyObject *kw) {
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_Format(PyExc_TypeError, "a dy.block call takes no keyword arguments, got %R", kw);
        return NULL;
    }
    if (expr_type && PyTuple_GET_SIZE(args) <= MAX_CALL_ARGS) {
        PyObject *plans = PyObject_GetAttr(self, s_plans), *sh = plans ? PyObject_GetAttr(self, s_share) : NULL;
        int share = sh ? PyObject_IsTrue(sh) : -1;
        PyObject *out;
        if (share < 0)
            out = NULL;  /* the attribute's or truth test's error */
        else if (!PyDict_Check(plans))
            out = Py_NewRef(Py_None);  /* not a plan table: the Python path */
        else
            out = block_call_core(plans, args, share);
        Py_XDECREF(plans);
        Py_XDECREF(sh);
        if (out != Py_None) return out;  /* the outputs, or NULL with the error */
        Py_DECREF(out);
    }
    PyObject *ca[2] = {self, args};
    return PyObject_VectorcallMethod(s_call_py, ca, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

PyTypeObject DgcBlockCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dynagraph._coarsen.BlockCall",
    .tp_doc = "The base of dy.block's Block: its call, compiled (kernels/cpython/block_call.c).",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_call = block_tp_call,
    .tp_new = PyType_GenericNew,
};

int dgc_block_type_ready(PyObject *module) {
    if (!(s_plans = PyUnicode_InternFromString("_plans")) || !(s_share = PyUnicode_InternFromString("share"))
        || !(s_call_py = PyUnicode_InternFromString("_call_py")) || PyType_Ready(&DgcBlockCallType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "BlockCall", (PyObject *)&DgcBlockCallType);
}
