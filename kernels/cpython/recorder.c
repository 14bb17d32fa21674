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
    Py_VISIT(g->table.of);
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

/* The columns that are lists, whose storage columns.c's pools keep. */
static PyObject **list_column(GraphObject *g, int k) {
    PyObject **cols[DG_LIST_COLUMNS] = {&g->op, &g->args, &g->attrs, &g->data, &g->shape, &g->depth, &g->sig,
                                       &g->sig_part, &g->needs_grad, &g->blk, &g->row, &g->blocks,
                                       &g->signatures};
    return cols[k];
}

static int graph_clear(GraphObject *g) {
    dg_table_free(&g->table);  /* first: its reference to args would keep that list out of the pool */
    for (int k = 0; k < DG_LIST_COLUMNS; k++) {
        PyObject *l = *list_column(g, k);
        *list_column(g, k) = NULL;
        if (l)
            dg_pool_list(k, l);
    }
    for (int k = 0; k < N_COLUMNS; k++)
        Py_CLEAR(*graph_column(g, k));
    dg_sig_cache_clear(g);
    return 0;
}

/* The list columns (list_column's order) whose items are only ints, bools or tuples of ints:
   args, shape, depth, sig, needs_grad, blk, row. Such a list can be on no reference cycle, so
   the cyclic GC need not see it; a mini-batch's graph holds tens of thousands of nodes, and
   each collection that reached these lists visited every item (a cache miss per int object):
   5-10% of a BiLSTM tagger's step at H=64. Untracked once, a list stays so, pooled or not. */
static const char COLUMN_ACYCLIC[DG_LIST_COLUMNS] = {0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0};

/* _start(): a new graph's empty columns (lists kept from freed graphs where there are). */
static PyObject *graph_start(GraphObject *g, PyObject *unused) {
    (void)unused;
    for (int k = 0; k < DG_LIST_COLUMNS; k++) {
        PyObject *l = dg_pooled_list(k);
        if (!l)
            return NULL;
        if (COLUMN_ACYCLIC[k])
            PyObject_GC_UnTrack(l);
        Py_XSETREF(*list_column(g, k), l);
    }
    PyObject **dicts[3] = {&g->sig_id, &g->leaves, &g->block_param};
    for (int k = 0; k < 3; k++) {
        PyObject *d = PyDict_New();
        if (!d)
            return NULL;
        Py_XSETREF(*dicts[k], d);
    }
    dg_table_start(g);
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
    dg_sig_cache_free(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
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

/* Append one value to a column, stealing the reference. */
static int append_steal(PyObject *list, PyObject *v) {
    if (!v)
        return -1;
    int rc = dg_col_append(list, v);
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
int dg_columns_ready(GraphObject *g) {
    LIST_OR_SLOW(g->op); LIST_OR_SLOW(g->args); LIST_OR_SLOW(g->attrs); LIST_OR_SLOW(g->data);
    LIST_OR_SLOW(g->shape); LIST_OR_SLOW(g->depth); LIST_OR_SLOW(g->sig); LIST_OR_SLOW(g->sig_part);
    LIST_OR_SLOW(g->needs_grad);
    if (!g->sig_id || !PyDict_CheckExact(g->sig_id))
        return 0;
    Py_ssize_t nodes = PyList_GET_SIZE(g->op);
    return PyList_GET_SIZE(g->depth) == nodes && PyList_GET_SIZE(g->sig_part) == nodes
           && PyList_GET_SIZE(g->needs_grad) == nodes && PyList_GET_SIZE(g->shape) == nodes;
}

/* The arguments' ids checked (the first SIG_CACHE_ARGS into idx, for the node table), their
   sig_part (part, as many, borrowed), the deepest depth and whether any needs a gradient. 1,
   or 0 when Python must decide. */
static inline int scan_args(GraphObject *g, PyObject *ids, Py_ssize_t nodes, PyObject **part, int32_t *idx,
                            long *depth, int *needs) {
    *depth = 0;
    *needs = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ids); k++) {
        Py_ssize_t i = node_index(PyTuple_GET_ITEM(ids, k), nodes);
        if (i < 0)
            return 0;
        if (k < SIG_CACHE_ARGS) {
            part[k] = PyList_GET_ITEM(g->sig_part, i);
            idx[k] = (int32_t)i;  /* kept only for a node below INT32_MAX (dg_table_push_ids), so i is too */
        }
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
        dg_sig_cache_put(g, op, attrs, part, n, known);
        PyObject *shapes[SIG_CACHE_ARGS];
        dg_arg_shapes(g, ids, shapes);
        dg_global_put(op, attrs, part, shapes, n, key, known);
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
        dg_col_append(g->op, op) < 0 || dg_col_append(g->args, ids) < 0 ||
        dg_col_append(g->attrs, PyTuple_GET_ITEM(known, 2)) < 0 ||
        dg_col_append(g->shape, shape) < 0 ||
        append_steal(g->depth, dg_int(depth + 1)) < 0 ||
        dg_col_append(g->sig, PyTuple_GET_ITEM(known, 0)) < 0 ||
        dg_col_append(g->sig_part, shape) < 0 ||
        dg_col_append(g->needs_grad, needs && !blocks ? Py_True : Py_False) < 0)
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
    if (!dg_columns_ready(g))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(ids), nodes = PyList_GET_SIZE(g->op);
    long depth;
    int needs;
    PyObject *part[SIG_CACHE_ARGS];  /* borrowed: the arguments' sig_part, for the cache */
    int32_t idx[SIG_CACHE_ARGS];     /* their node ids, for the node table */
    if (!scan_args(g, ids, nodes, part, idx, &depth, &needs))
        return NULL;
    PyObject *known = dg_sig_cache_get(g, op, attrs, part, n);
    if (!known && n <= SIG_CACHE_ARGS) {  /* new to this graph: known to an earlier one? */
        PyObject *shapes[SIG_CACHE_ARGS];
        int failed;
        dg_arg_shapes(g, ids, shapes);
        known = dg_global_get(g, op, attrs, part, shapes, n, &failed);
        if (failed) {
            *slow = 0;
            return NULL;
        }
        if (known)
            dg_sig_cache_put(g, op, attrs, part, n, known);
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
    PyObject *nid = dg_int(nodes);  /* shared across graphs (executor.c): no int to allocate and free per node */
    if (!nid)
        return NULL;
    if (append_node(g, op, ids, known, data, nid, depth, needs) < 0) {
        Py_DECREF(nid);
        return NULL;
    }
    if (n <= SIG_CACHE_ARGS)
        dg_table_push_ids(g, nodes, ids, idx, n);
    else
        dg_table_push(g, nodes, ids, NULL);
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

static PyGetSetDef graph_getset[] = {
    {"_rand_base", (getter)graph_get_rand_base, (setter)graph_set_rand_base,
     "random key of node 0 (node i's is this + i), drawn on first use", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* _truncate_table(n): revert() dropped nodes n and after from the columns. */
static PyObject *graph_truncate_table(GraphObject *g, PyObject *n) {
    Py_ssize_t v = PyLong_AsSsize_t(n);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    dg_table_truncate(g, v);
    Py_RETURN_NONE;
}

/* _node_table(): the node table as a list of tuples (what args holds), brought up to date
   first; None when it cannot mirror args. For the tests. */
static PyObject *graph_node_table(GraphObject *g, PyObject *unused) {
    (void)unused;
    Py_ssize_t n = g->args && PyList_CheckExact(g->args) ? PyList_GET_SIZE(g->args) : 0;
    const NodeTable *t = dg_table_of((PyObject *)g, g->args, n);
    if (!t)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        Py_ssize_t k = (Py_ssize_t)(t->start[i + 1] - t->start[i]);
        PyObject *ids = PyTuple_New(k);
        for (Py_ssize_t j = 0; ids && j < k; j++) {
            PyObject *v = PyLong_FromLong(t->arg[t->start[i] + j]);
            if (!v)
                Py_CLEAR(ids);
            else
                PyTuple_SET_ITEM(ids, j, v);
        }
        if (!ids)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, ids);
    }
    return out;
}

static PyMethodDef graph_methods[] = {
    {"_node_table", (PyCFunction)graph_node_table, METH_NOARGS,
     "_node_table(): the C node table's argument ids per node (equal to args), or None."},
    {"_truncate_table", (PyCFunction)graph_truncate_table, METH_O,
     "_truncate_table(n): the node table loses nodes n and after (revert() truncates the columns)."},
    {"_start", (PyCFunction)graph_start, METH_NOARGS, "_start(): the new graph's empty columns."},
    {"add", (PyCFunction)(void (*)(void))graph_add, METH_FASTCALL,
     "add(op, ids, attrs=(), data=None) -> node id. Record one node (see ComputationGraph._add_py)."},
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
    if (PyType_Ready(&GraphBaseType) < 0)
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
