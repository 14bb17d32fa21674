/* The node table: every node's argument ids as flat int32 arrays (CSR) beside the graph's
`args` list (part of dynagraph._bookkeeping; see recorder.h).

`args` holds one tuple of int objects per node, each somewhere in the heap: reading a node's
arguments costs a tuple and an int per argument, and the agenda and the run tables read them
for every node of a mini-batch (a 34,000-node TreeLSTM graph: a third of the agenda's
instructions). The recorder appends each node's ids here as it appends the tuple; nodes
recorded elsewhere (Python's add and leaf paths) are read from `args` when the table is
next asked for (dg_table_of). The list stays the reference: the table only ever holds what
the list holds, for a prefix of it.
*/
#include "recorder.h"

#include <string.h>

/* One freed table's arrays, kept for the next graph: a per-sentence program makes a graph
   per sentence, and each would otherwise allocate and grow its own. */
static NodeTable spare = {0};

void dg_table_free(NodeTable *t) {
    Py_CLEAR(t->of);
    if (!spare.start && t->start && t->arg) {
        spare = *t;
        spare.n = 0;
        spare.of = NULL;
    } else {
        PyMem_Free(t->start);
        PyMem_Free(t->arg);
    }
    memset(t, 0, sizeof *t);
}

/* A new graph's empty table, mirroring its new args list. */
void dg_table_start(GraphObject *g) {
    NodeTable *t = &g->table;
    if (!t->start && spare.start) {
        *t = spare;
        memset(&spare, 0, sizeof spare);
    }
    t->n = 0;
    Py_XINCREF(g->args);
    Py_XSETREF(t->of, g->args);
}

/* Room for node n's k arguments. 0, or -1 (no memory: the caller leaves the table behind). */
static int table_room(NodeTable *t, Py_ssize_t k) {
    if (t->n + 2 > t->cap) {
        Py_ssize_t cap = t->cap ? 2 * t->cap : 1024;
        while (cap < t->n + 2)
            cap *= 2;
        int64_t *s = PyMem_Realloc(t->start, (size_t)cap * sizeof(int64_t));
        if (!s)
            return -1;
        if (!t->start)
            s[0] = 0;
        t->start = s;
        t->cap = cap;
    }
    Py_ssize_t used = (Py_ssize_t)t->start[t->n];
    if (used + k > t->arg_cap) {
        Py_ssize_t cap = t->arg_cap ? 2 * t->arg_cap : 4096;
        while (cap < used + k)
            cap *= 2;
        int32_t *a = PyMem_Realloc(t->arg, (size_t)cap * sizeof(int32_t));
        if (!a)
            return -1;
        t->arg = a;
        t->arg_cap = cap;
    }
    return 0;
}

/* Node t->n's arguments from its tuple: node ids below the node's own (an argument is
   recorded before its users). 1, or 0 when the tuple is anything else (the table stays behind). */
static int table_append(NodeTable *t, PyObject *ids) {
    if (!PyTuple_CheckExact(ids))
        return 0;
    Py_ssize_t k = PyTuple_GET_SIZE(ids);
    if (table_room(t, k) < 0)
        return 0;
    int32_t *out = t->arg + t->start[t->n];
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *v = PyTuple_GET_ITEM(ids, j);
        Py_ssize_t a = PyLong_CheckExact(v) ? dg_as_ssize(v) : -1;
        if (a < 0 || a >= t->n) {
            PyErr_Clear();
            return 0;
        }
        out[j] = (int32_t)a;
    }
    t->start[t->n + 1] = t->start[t->n] + k;
    t->n++;
    return 1;
}

/* Node t->n's arguments as the recorder checked them (idx, node ids below it). */
static void table_append_ids(NodeTable *t, const int32_t *idx, Py_ssize_t k) {
    if (table_room(t, k) < 0)
        return;
    memcpy(t->arg + t->start[t->n], idx, (size_t)k * sizeof(int32_t));
    t->start[t->n + 1] = t->start[t->n] + k;
    t->n++;
}

/* The recorder's append: node `nid` (already in the args list as `ids`; idx, its ids as the
   recorder read them, or NULL), after any nodes Python added since the last (an esum of many
   terms, a leaf made in Python), read from the list while they are fresh in the cache. */
void dg_table_push(GraphObject *g, Py_ssize_t nid, PyObject *ids, const int32_t *idx) {
    NodeTable *t = &g->table;
    if (t->of != g->args || nid >= INT32_MAX || !PyList_CheckExact(g->args) || nid >= PyList_GET_SIZE(g->args))
        return;
    while (t->n < nid)
        if (!table_append(t, PyList_GET_ITEM(g->args, t->n)))
            return;  /* left behind: dg_table_of tries again from there */
    if (t->n == nid && idx)
        table_append_ids(t, idx, PyTuple_GET_SIZE(ids));
    else if (t->n == nid)
        table_append(t, ids);
}

/* The table of graph cg covering nodes [0, upto), when `args` is cg's argument list:
   first it reads what the recorder did not append (nodes added by Python) from the list.
   NULL, without an exception, when cg is not a GraphBase, args is not its list, or some node
   below upto has arguments the table cannot hold: the caller reads the list then. */
const NodeTable *dg_table_of(PyObject *cg, PyObject *args, Py_ssize_t upto) {
    if (!cg || !PyObject_TypeCheck(cg, &GraphBaseType))
        return NULL;
    GraphObject *g = (GraphObject *)cg;
    NodeTable *t = &g->table;
    if (g->args != args || !PyList_CheckExact(args) || upto > PyList_GET_SIZE(args) || upto >= INT32_MAX)
        return NULL;
    if (t->of != args) {  /* the column was replaced: start over from the list */
        t->n = 0;
        Py_INCREF(args);
        Py_XSETREF(t->of, args);  /* held: no other list can take its address while compared */
    }
    if (t->n > PyList_GET_SIZE(args))  /* shortened behind the table's back (revert() truncates it first) */
        t->n = PyList_GET_SIZE(args);
    while (t->n < upto)
        if (!table_append(t, PyList_GET_ITEM(args, t->n)))
            return NULL;
    return t;
}

/* revert(): the columns lose nodes n and after; so does the table. */
void dg_table_truncate(GraphObject *g, Py_ssize_t n) {
    if (n < 0)
        n = 0;
    if (g->table.n > n)
        g->table.n = n;
}
